"""Ledger entries and reading them: the line format, its hash, and a streaming reader.

Split from ``chain`` (which writes) so that ``verify`` and ``chain`` share it without a cycle.
``iter_ledger`` reads one line at a time (memory does not grow with the ledger); ``read_ledger``
collects it for callers that want every entry.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from ...contracts.bounded_json import LEDGER_LINE_LIMITS, parse_json
from ...contracts.frozen_mapping import FrozenDict, to_frozen_dict

GENESIS = "sha256:" + "0" * 64
"""The ``prev`` of a ledger's first entry."""

UNVERIFIED = "unverified"
"""What an entry's ``certificate`` says when the run opted out of admission."""

ENTRY_KINDS = frozenset({"run_start", "receipt", "audit", "checkpoint", "run_end", "note"})
"""Kinds of ledger entries."""

_FIELDS = ("seq", "kind", "time", "certificate", "payload", "prev", "hash")


class LedgerError(RuntimeError):
    """A ledger file cannot be appended to or read as written (torn line, broken JSON)."""


@attrs.frozen
class LedgerEntry:
    """One ledger line: sequence number, kind, certificate link, payload, and its chain hashes."""

    seq: int
    kind: str
    time: str
    certificate: str
    payload: FrozenDict = attrs.field(converter=to_frozen_dict)
    prev: str
    hash: str

    def body(self) -> dict[str, Any]:
        """Every field but ``hash``: what the hash covers."""
        return {"seq": self.seq, "kind": self.kind, "time": self.time, "certificate": self.certificate,
                "payload": self.payload.to_dict(), "prev": self.prev}

    def to_line(self) -> str:
        """The JSON line written to the file."""
        return json.dumps({**self.body(), "hash": self.hash}, sort_keys=True, separators=(",", ":"))


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def entry_hash(body: Mapping[str, Any], key: bytes | None = None) -> str:
    """``sha256:<hex>`` of the canonical body, or ``hmac-sha256:<hex>`` under ``key``."""
    data = _canonical(body)
    if key:
        return "hmac-sha256:" + hmac.new(bytes(key), data, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(data).hexdigest()


@attrs.frozen
class ReadResult:
    """Entries parsed from a ledger file, plus a description of a torn last line if there is one."""

    entries: tuple[LedgerEntry, ...]
    torn: str | None
    problems: tuple[tuple[int, str], ...]
    line_numbers: tuple[int, ...] = ()
    torn_line: int | None = None


def _check_record(record: Any) -> None:
    """Field names and types of one ledger line, before anything trusts them."""
    if not isinstance(record, dict) or set(record) != set(_FIELDS):
        raise ValueError(f"expected exactly the fields {sorted(_FIELDS)}")
    if isinstance(record["seq"], bool) or not isinstance(record["seq"], int) or not 0 <= record["seq"] < 2**53:
        raise ValueError(f"'seq' must be a non-negative integer, got {record['seq']!r:.40}")
    for name in ("kind", "time", "certificate", "prev", "hash"):
        if not isinstance(record[name], str):
            raise ValueError(f"{name!r} must be a string, got {type(record[name]).__name__}")
    if not isinstance(record["payload"], dict):
        raise ValueError(f"'payload' must be an object, got {type(record['payload']).__name__}")


def read_ledger(path: str | os.PathLike[str]) -> ReadResult:
    """Parse every line; malformed lines are reported (a bad final line without newline is 'torn')."""
    entries: list[LedgerEntry] = []
    numbers: list[int] = []
    problems: list[tuple[int, str]] = []
    torn, torn_line = None, None
    for line in iter_ledger(path):
        if line.torn:
            torn, torn_line = line.problem, line.number
            if line.entry is not None:  # complete JSON, only the newline is missing
                entries.append(line.entry)
                numbers.append(line.number)
        elif line.entry is None:
            problems.append((line.number, line.problem or ""))
        else:
            entries.append(line.entry)
            numbers.append(line.number)
    return ReadResult(tuple(entries), torn, tuple(problems), tuple(numbers), torn_line)


def truncate_torn_tail(path: str | os.PathLike[str]) -> int:
    """Remove a torn last line (deliberate repair after a crash); returns the bytes removed."""
    target = Path(path)
    raw = target.read_bytes()
    if raw.endswith(b"\n") or not raw:
        return 0
    keep = raw.rfind(b"\n") + 1
    with open(target, "r+b") as handle:
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    return len(raw) - keep


@attrs.frozen(slots=True)
class RawEntry:
    """A ledger entry as parsed, its payload left as plain JSON (not frozen): for one-pass checks like the audit."""

    seq: int
    kind: str
    time: str
    certificate: str
    payload: dict[str, Any]
    prev: str
    hash: str

    def body(self) -> dict[str, Any]:
        """Every field but ``hash``: what the hash covers."""
        return {"seq": self.seq, "kind": self.kind, "time": self.time, "certificate": self.certificate,
                "payload": self.payload, "prev": self.prev}


@attrs.frozen
class LedgerLine:
    """One line of a ledger as read: its 1-based number, the entry (None if it is not one) and the problem."""

    number: int
    entry: Any
    problem: str | None
    torn: bool = False


def iter_ledger(path: str | os.PathLike[str], *, raw: bool = False) -> Iterator[LedgerLine]:
    """Every line of the ledger in order, one at a time; a last line without newline is ``torn``.

    Entries are ``LedgerEntry`` objects, or ``RawEntry`` (payload not frozen, cheaper) with ``raw=True``.
    """
    make = RawEntry if raw else LedgerEntry
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            complete = line.endswith(b"\n")
            try:
                record = parse_json(line, LEDGER_LINE_LIMITS, what=f"ledger line {number}")  # strict, bounded
                _check_record(record)
                entry = make(**record)
            except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
                if complete:
                    yield LedgerLine(number, None, f"not a ledger entry: {exc}")
                else:
                    yield LedgerLine(number, None, f"torn last line (no final newline, {len(line)} bytes: {exc}); "
                                     "a crash during append? `truncate_torn_tail` removes it", torn=True)
                continue
            if complete:
                yield LedgerLine(number, entry, None)
            else:
                yield LedgerLine(number, entry, "torn last line: it has no final newline; the last append may not "
                                 "have completed", torn=True)
