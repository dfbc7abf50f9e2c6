"""Ledger entries and reading them: the line format, its hash, and a streaming reader.

Split from ``chain`` (which writes) so that ``verify`` and ``chain`` share it without a cycle.
``iter_ledger`` reads one line at a time (memory does not grow with the ledger); ``read_ledger``
collects it for callers that want every entry.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterator, Mapping
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any, NamedTuple

import attrs

from ...contracts.bounded_json import LEDGER_LINE_LIMITS, parse_canonical, parse_json
from ...contracts.canonical_json import hashed_json_bytes, ledger_line_text
from ...contracts.frozen_mapping import FrozenDict, to_frozen_dict
from ...contracts.safe_read import open_regular
from .lines import OverlongLine, bounded_lines
from .receipt_line import match_receipt

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
        return ledger_line_text({**self.body(), "hash": self.hash})


def entry_hash(body: Mapping[str, Any], key: bytes | None = None) -> str:
    """``sha256:<hex>`` of the canonical body (``hashed_json_bytes``), or ``hmac-sha256:<hex>`` under ``key``."""
    return hash_canonical(hashed_json_bytes(body), key)


def hash_canonical(data: bytes, key: bytes | None = None) -> str:
    """``entry_hash`` of a body already encoded canonically (``RawEntry.canonical``)."""
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
    with open_regular(target, what="ledger") as source:
        raw = source.read()
    if raw.endswith(b"\n") or not raw:
        return 0
    keep = raw.rfind(b"\n") + 1
    with open(target, "r+b") as handle:
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    return len(raw) - keep


class RawEntry(NamedTuple):
    """A ledger entry as parsed, its payload left as plain JSON (not frozen): for one-pass checks like the audit.

    A named tuple, not an attrs class: the audit makes one per line, a million for a large ledger.
    """

    seq: int
    kind: str
    time: str
    certificate: str
    payload: dict[str, Any]
    prev: str
    hash: str
    canonical: bytes | None = None
    """The canonical bytes of ``body()`` cut from the line itself, when the line was canonical (else None)."""
    receipt_facts: tuple[int, bool, dict[str, Any]] | None = None
    """(step, skipped, extra) of a receipt entry already checked against StepReceipt's validators (else None)."""

    def body(self) -> dict[str, Any]:
        """Every field but ``hash``: what the hash covers."""
        return {"seq": self.seq, "kind": self.kind, "time": self.time, "certificate": self.certificate,
                "payload": self.payload, "prev": self.prev}


class LedgerLine(NamedTuple):
    """One line of a ledger as read: its 1-based number, the entry (None if it is not one) and the problem."""

    number: int
    entry: Any
    problem: str | None
    torn: bool = False


def _body_bytes(line: bytes, record: dict[str, Any]) -> bytes | None:
    """The canonical body (what the hash covers) of a canonical line: the line without its ``hash`` member.

    Keys are sorted, so the line reads ``{"certificate":C,"hash":H,...}``; the cut is checked, not assumed.
    The line holds no ``\\u`` escape, so its ASCII encoding equals the body's ``ensure_ascii=False`` one.
    """
    start = 15 + len(encode_basestring_ascii(record["certificate"]))  # len('{"certificate":') == 15
    member = b',"hash":' + encode_basestring_ascii(record["hash"]).encode("ascii")
    if line[start:start + len(member)] != member:
        return None
    return line[:start] + line[start + len(member):len(line) - line.endswith(b"\n")]


def _entry(line: bytes, number: int, raw: bool) -> LedgerEntry | RawEntry:
    """One line as an entry: a fast path when it provably applies (see ``receipt_line``), else the strict parser."""
    if raw:
        receipt = match_receipt(line)
        if receipt is not None:  # its fields and their types are the pattern's
            return RawEntry(**receipt.record, canonical=receipt.canonical, receipt_facts=receipt.facts)
    record = parse_canonical(line, LEDGER_LINE_LIMITS)
    if record is None:
        record = parse_json(line, LEDGER_LINE_LIMITS, what=f"ledger line {number}")  # strict, bounded
        _check_record(record)
        return RawEntry(**record) if raw else LedgerEntry(**record)
    _check_record(record)
    if not raw:
        return LedgerEntry(**record)
    return RawEntry(**record, canonical=_body_bytes(line, record))


def ledger_line(data: bytes, number: int, *, raw: bool = False) -> LedgerLine:
    """Line ``number`` of a ledger, as read: its entry or its problem; a line without final newline is ``torn``."""
    complete = data.endswith(b"\n")
    try:
        entry = _entry(data, number, raw)
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        if complete:
            return LedgerLine(number, None, f"not a ledger entry: {exc}")
        return LedgerLine(number, None, f"torn last line (no final newline, {len(data)} bytes: {exc}); "
                          "a crash during append? `truncate_torn_tail` removes it", torn=True)
    if complete:
        return LedgerLine(number, entry, None)
    return LedgerLine(number, entry, "torn last line: it has no final newline; the last append may not "
                      "have completed", torn=True)


def iter_ledger(path: str | os.PathLike[str], *, raw: bool = False) -> Iterator[LedgerLine]:
    """Every line of the ledger in order, one at a time; a last line without newline is ``torn``.

    Entries are ``LedgerEntry`` objects, or ``RawEntry`` (payload not frozen, cheaper) with ``raw=True``.
    """
    with open_regular(path, what="ledger") as handle:  # never through a link, never blocking on a FIFO
        for number, data in bounded_lines(handle, LEDGER_LINE_LIMITS.max_bytes):
            yield ledger_line(data, number, raw=raw) if isinstance(data, bytes) else overlong_line(data, number)


def overlong_line(line: OverlongLine, number: int) -> LedgerLine:
    """Line ``number``, over the line limit and skipped unread: a problem (``torn`` when it is the unfinished last)."""
    return LedgerLine(number, None, f"not a ledger entry: {line.problem(LEDGER_LINE_LIMITS.max_bytes)}",
                      torn=not line.complete)
