"""Verify a ledger: hash chain, signed seals and head, sequence, steps, certificate links; name the first bad line.

``main_audit(argv)`` is the ``mixle-parallel audit LEDGER`` command; it exits 0 only for a
ledger with no fault.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from hashlib import sha256
from typing import Any

import attrs

from ...contracts import (
    AdmissionCertificate,
    AdmissionMode,
    CertificateEnvelope,
    ContractError,
    FrozenDict,
    NotAdmittedError,
    SDCAuditRecord,
    from_dict,
)
from ...contracts.bounded_json import LEDGER_LINE_LIMITS
from ...contracts.receipts import receipt_facts
from ...contracts.safe_read import open_regular
from ..attestation import open_envelope, read_unverified
from ..cert_store import CertificateStore
from ..keys import KEY_ENV, TrustStore, load_key
from .entries import (
    ENTRY_KINDS,
    GENESIS,
    UNVERIFIED,
    LedgerEntry,
    LedgerError,
    RawEntry,
    entry_hash,
    hash_canonical,
    ledger_line,
    overlong_line,
)
from .lines import bounded_lines
from .receipt_line import ReceiptScan, scan_receipt
from .seal import check_head, check_seal, head_path, read_head

MAX_FAULTS = 1000
"""Faults kept in a report (the rest are counted): a report's memory does not grow with the ledger."""


@attrs.frozen
class LedgerFault:
    """One problem, located by 1-based line number and the entry's sequence number when known."""

    line: int
    seq: int | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" + (f" (seq {self.seq})" if self.seq is not None else "")
        return f"{where}: {self.message}"


@attrs.frozen
class LedgerReport:
    """The verdict on one ledger: entry counts, faults (first bad entry first), runs, warnings."""

    path: str
    entries: int
    runs: int
    receipts: int
    audits: int
    keyed: bool
    faults: tuple[LedgerFault, ...]
    warnings: tuple[str, ...]
    signed_head: str = ""
    unverified_runs: int = 0
    """Runs that started with admission 'unverified' (no certificate vouches for them; not a fault)."""
    unchecked_runs: int = 0
    """Runs naming a certificate id the audit found nowhere to check (a warning; not counted as certified)."""

    @property
    def ok(self) -> bool:
        """True when no fault was found."""
        return not self.faults

    @property
    def first_bad(self) -> LedgerFault | None:
        """The first bad entry, by position in the file."""
        return self.faults[0] if self.faults else None

    def summary(self) -> str:
        """A few human-readable lines."""
        head = (f"{self.path}: {self.entries} entries, {self.runs} run(s), {self.receipts} receipts, "
                f"{self.audits} audit records, {'HMAC-keyed' if self.keyed else 'sha256 chain'}")
        if self.ok:
            certified = self.runs - self.unverified_runs - self.unchecked_runs
            return (head + "\nOK: chain, seals, sequence and steps verified; certificates: "
                    f"{certified} run(s) under a certificate signed by a key trusted for certify (links verified), "
                    f"{self.unverified_runs} run(s) unverified"
                    + (f", {self.unchecked_runs} run(s) naming a certificate NOT checked (see warnings)"
                       if self.unchecked_runs else "")
                    + (f"\n{self.signed_head}" if self.signed_head else ""))
        lines = [head, f"FAULT: first bad entry at {self.first_bad}"]
        lines += [f"  also: {fault}" for fault in self.faults[1:20]]
        if len(self.faults) > 20:
            lines.append(f"  ... {len(self.faults) - 20} more")
        return "\n".join(lines)


class _Run:
    def __init__(self, certificate: str) -> None:
        self.certificate = certificate
        self.ended = False
        self.last_step: dict[int, int] = {}
        self.last_committed: dict[int, int] = {}


def _plain(value: Any) -> Any:
    """A payload value as plain JSON data (a ``LedgerEntry``'s payload is frozen, a ``RawEntry``'s is not)."""
    return value.to_dict() if isinstance(value, FrozenDict) else value


def _link_problems(extra: Mapping[str, Any], certificate: str) -> list[str]:
    """What a receipt's ``extra`` says about its run (certificate, admission mode) that the run contradicts."""
    if not extra:
        return []
    problems = []
    linked = extra.get("certificate")
    if linked is not None and linked != certificate:
        problems.append(f"receipt says certificate {linked!r}, the run's is {certificate!r}")
    mode = extra.get("admission")
    if mode == AdmissionMode.UNVERIFIED and certificate != UNVERIFIED:
        problems.append(f"receipt says the run is unverified, but it started under certificate {certificate}")
    if mode == AdmissionMode.CERTIFIED and certificate == UNVERIFIED:
        problems.append("receipt says certified, but the run started unverified")
    return problems


def _shown(value: Any) -> str:
    """A short rendering of a value from an untrusted line, for a fault message."""
    text = repr(_plain(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _check_payload(entry: LedgerEntry | RawEntry, run: _Run, fault: Any) -> None:
    payload = entry.payload
    if entry.kind == "receipt":
        try:
            checked = entry.receipt_facts if type(entry) is RawEntry else None
            step, skipped, extra = checked or receipt_facts(_plain(payload["receipt"]))
        except (KeyError, AttributeError, ContractError) as exc:
            fault(f"receipt payload is not a StepReceipt document: {exc}")
            return
        rank = payload.get("rank", 0)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            fault(f"receipt payload's rank is {type(rank).__name__} {_shown(rank)}, not a non-negative integer")
            return
        if payload.get("step") != step:
            fault(f"payload step {payload.get('step')} differs from the receipt's step {step}")
        for problem in _link_problems(extra, run.certificate):
            fault(problem)
        previous = run.last_step.get(rank)
        if previous is not None and step < previous:
            fault(f"rank {rank} step went backwards: {step} after {previous}")
        if not skipped:
            committed = run.last_committed.get(rank)
            if committed is not None and step <= committed:
                fault(f"rank {rank} committed step {step} twice or out of order (last {committed})")
            run.last_committed[rank] = step
        run.last_step[rank] = max(step, previous if previous is not None else step)
    elif entry.kind == "audit":
        try:
            from_dict(_plain(payload["record"]), SDCAuditRecord)
        except (KeyError, AttributeError, ContractError) as exc:
            fault(f"audit payload is not an SDCAuditRecord document: {exc}")


def _covered_hash(entry: LedgerEntry | RawEntry, key: bytes | None) -> str:
    """``entry_hash`` of the entry's body: from the bytes cut from its canonical line when there are some."""
    canonical = entry.canonical if type(entry) is RawEntry else None
    if canonical is None:
        return entry_hash(entry.body(), key)
    return "sha256:" + sha256(canonical).hexdigest() if key is None else hash_canonical(canonical, key)


def _hash_problem(entry: LedgerEntry | RawEntry, key: bytes | None) -> str | None:
    """Why the entry's hash does not cover its contents (plain sha256 or legacy HMAC), or None."""
    if entry.hash.startswith("hmac-sha256:"):
        if key is None:
            return ("entry is HMAC-keyed but no key was given; pass --key-file or set "
                    f"{KEY_ENV['ledger'][0]} / {KEY_ENV['ledger'][1]}")
        if _covered_hash(entry, key) != entry.hash:
            return "contents do not match the entry's HMAC (edited after it was written, or the wrong key)"
        return None
    if key is not None:
        return "entry is not HMAC-keyed although a key was given (an unkeyed entry in a keyed ledger)"
    try:
        if _covered_hash(entry, None) != entry.hash:
            return "contents do not match the entry's hash (edited after it was written)"
    except (ValueError, TypeError) as exc:
        return f"contents cannot be hashed: {exc}"
    return None


def _start_problems(entry: LedgerEntry | RawEntry, store: TrustStore | None) -> list[str]:
    """A run_start's certificate: 'unverified', or the id of a certificate that a key trusted for ``certify``
    signed (embedded as its envelope, or found by id in the local certificate store), issued before the run.

    ``store`` None (a writer checking the chain before it appends): only the link to an embedded document."""
    link = entry.certificate
    if link == UNVERIFIED:
        return []
    if not link.startswith("sha256:"):
        return [f"run_start certificate {link!r} is neither a certificate id nor 'unverified'"]
    document = entry.payload.get("certificate_document")
    try:
        raw = _plain(document) if document is not None else None
        if raw is not None and not isinstance(raw, dict):
            raise ContractError(f"it is a {type(raw).__name__}")
        if raw is not None and raw.get("kind") != "CertificateEnvelope":
            cert = from_dict(raw, AdmissionCertificate)
            if store is None:
                return ([] if cert.certificate_id == link else
                        [f"the embedded certificate's id {cert.certificate_id} differs from the run's link"])
            return [f"the run started under an UNSIGNED certificate ({cert.certificate_id[:19]}..., issued "
                    f"{cert.issued_at}): no key vouches for it, so the run is not certified; "
                    "certified runs embed a certificate signed by a key trusted for certify"]
        if store is None:
            unread = read_unverified(from_dict(raw, CertificateEnvelope)) if raw is not None else None
            return ([] if unread is None or unread.certificate_id == link else
                    [f"the embedded certificate's id {unread.certificate_id} differs from the run's link"])
        envelope = from_dict(raw, CertificateEnvelope) if raw is not None else _stored_envelope(link, store)
        if envelope is None:
            return [_UNCHECKED]
        try:
            cert, _ = open_envelope(envelope, store)
        except NotAdmittedError as exc:
            unchecked = read_unverified(envelope)
            return [f"the run's certificate {unchecked.certificate_id[:19]}... is not signed by a key trusted for "
                    f"certify ({'; '.join(exc.reasons)}): the run is not vouched for; trust the signer with "
                    "`mixle-parallel keys trust --for certify` if you know it, else treat the run as unverified"]
    except (ContractError, NotAdmittedError, AttributeError, TypeError) as exc:
        return [f"embedded certificate is not a certificate document: {exc}"]
    problems = []
    if cert.certificate_id != link:
        problems.append(f"the embedded certificate's id {cert.certificate_id} differs from the run's link")
    if _later(cert.issued_at, entry.time):
        problems.append(f"the run's certificate was issued at {cert.issued_at}, after the run started ({entry.time})")
    return problems


_UNCHECKED = "unchecked"
"""``_start_problems``' answer for a bare certificate id found nowhere: a warning, and the run is not counted as
certified (the library's writers always embed the signed envelope; a bare id comes only from a hand call)."""


def _later(issued_at: str, started: str) -> bool:
    """True when a certificate's issue time is after the run's start (either unreadable: not judged here)."""
    try:
        return datetime.fromisoformat(issued_at) > datetime.fromisoformat(started)
    except (TypeError, ValueError):
        return False


def _stored_envelope(link: str, store: TrustStore) -> CertificateEnvelope | None:
    """The envelope with certificate id ``link`` in the trust store's local certificate store, if any."""
    for envelope, cert, _ in CertificateStore(store.home).entries():
        if cert.certificate_id == link:
            return envelope
    return None


class _LedgerWalk:
    """The state of one pass over a ledger's entries: faults and warnings found, counts, the open run."""

    def __init__(self, key: bytes | None, store: TrustStore, certificates: bool = True) -> None:
        self.key, self.store = key, store
        self.certificates = certificates
        """Check each run's certificate signature (the audit); a writer about to append checks only the chain."""
        self.faults: list[LedgerFault] = []
        self.warnings: list[str] = []
        self.counts = {"run_start": 0, "receipt": 0, "audit": 0}
        self.unverified_runs = 0
        self.unchecked_runs = 0
        self.run: _Run | None = None
        self.prev_hash = GENESIS
        self.count = 0
        self.keyed = False
        self.dropped = 0
        self.last_line = 0

    def add(self, fault: LedgerFault) -> None:
        """Keep a fault (the first ``MAX_FAULTS``; later ones are only counted)."""
        if len(self.faults) < MAX_FAULTS:
            self.faults.append(fault)
        else:
            self.dropped += 1

    def check(self, index: int, line: int, entry: LedgerEntry | RawEntry) -> None:
        """One entry: its place in the chain and sequence, its hash, then what its kind requires."""

        def fault(message: str) -> None:
            self.add(LedgerFault(line, entry.seq, message))

        if entry.seq != index:
            fault(f"sequence number {entry.seq} where {index} was expected (an entry was deleted, inserted or "
                  "reordered)")
        if entry.prev != self.prev_hash:
            fault("chain broken: prev does not match the previous entry's hash "
                  "(an entry before it was deleted, reordered or edited)")
        problem = _hash_problem(entry, self.key)
        if problem:
            fault(problem)
        self.keyed = self.keyed or entry.hash.startswith("hmac-sha256:")
        self.prev_hash = entry.hash
        if entry.kind not in ENTRY_KINDS:
            fault(f"unknown entry kind {entry.kind!r}")
            return
        if entry.kind in self.counts:
            self.counts[entry.kind] += 1
        if entry.kind == "run_start":
            if self.run is not None and not self.run.ended:
                self.warnings.append(
                    f"line {line}: a run started while the previous one had no run_end (resumed after a crash?)")
            self.run = _Run(entry.certificate)
            if entry.certificate == UNVERIFIED:
                self.unverified_runs += 1
            problems = _start_problems(entry, self.store if self.certificates else None)
            if problems == [_UNCHECKED]:
                self.unchecked_runs += 1
                self.warnings.append(
                    f"line {line}: the run names certificate {entry.certificate[:19]}... but embeds no signed "
                    "certificate and none with that id is in the local certificate store: its signature was NOT "
                    "checked (add the signed certificate to the store, or treat the run as unverified)")
            else:
                for problem in problems:
                    fault(problem)
        elif self.run is None:
            fault(f"{entry.kind} entry before any run_start")
        else:
            self._in_run(entry, self.run, fault)

    def clean_receipt(self, index: int, scan: ReceiptScan) -> bool:
        """Take receipt ``index`` from its scan when ``check`` would find no fault in it, leaving the state ``check``
        leaves; False, changing nothing, when anything about it is off (``check`` then reads it and names that).

        The audit's fast path: the same rules as ``check`` and ``_check_payload`` for a receipt, on the fields
        ``scan_receipt`` proved (a valid StepReceipt in a canonical line), without building the entry.
        """
        run, key, step, rank = self.run, self.key, scan.step, scan.rank
        if (scan.seq != index or scan.prev != self.prev_hash or run is None or run.ended or rank < 0
                or scan.certificate != run.certificate or scan.payload_step != step
                or (key is not None) != scan.hash.startswith("hmac-sha256:")
                or hash_canonical(scan.canonical, key) != scan.hash or _link_problems(scan.extra, run.certificate)):
            return False
        previous = run.last_step.get(rank)
        committed = None if scan.skipped else run.last_committed.get(rank)
        if (previous is not None and step < previous) or (committed is not None and step <= committed):
            return False
        self.keyed = self.keyed or key is not None  # a hash taken here is HMAC-keyed exactly when a key is given
        self.prev_hash = scan.hash
        self.counts["receipt"] += 1
        if not scan.skipped:
            run.last_committed[rank] = step
        run.last_step[rank] = step  # not below ``previous``, checked above
        return True

    def _in_run(self, entry: LedgerEntry | RawEntry, run: _Run, fault: Any) -> None:
        """An entry inside a run: after no run_end, linked to the run's certificate, its payload, its seal."""
        if run.ended:
            fault(f"{entry.kind} entry after run_end")
        if entry.certificate != run.certificate:
            fault(f"certificate link {entry.certificate!r} differs from the run_start's {run.certificate!r}")
        _check_payload(entry, run, fault)
        if entry.kind == "run_end":
            run.ended = True
            problem = check_seal(entry.payload.get("seal"), entry.seq, entry.prev, self.store) \
                if entry.payload.get("seal") is not None else "run_end carries no signed seal"
            if problem:
                fault(problem)


def _end_faults(walk: _LedgerWalk, torn: tuple[int, str] | None, problems: int, require_end: bool,
                ) -> list[LedgerFault]:
    """A torn last line, an empty ledger, or (``require_end``) a last run without run_end."""
    faults = []
    if torn is not None:
        faults.append(LedgerFault(torn[0], None, torn[1]))
    if not walk.count and not problems and torn is None:
        faults.append(LedgerFault(1, None, "the ledger is empty"))
    elif require_end and walk.run is not None and not walk.run.ended:
        faults.append(LedgerFault(walk.last_line + 1, None,
                                  f"ledger ends after seq {walk.count - 1} without run_end (truncated, or the run "
                                  "is still going: pass --allow-open)"))
    return faults


class _Head:
    """A signed head to check against the ledger: where it is, what it vouches for, what the ledger has there."""

    def __init__(self, where: str | os.PathLike[str], label: str, store: TrustStore) -> None:
        self.where, self.label = where, label
        self.problem: str | None = None
        self.entries, self.head, self.keyid, self.role = 0, "", "", None
        self.covered: tuple[str, str] | None = None
        try:
            self.entries, self.head, self.keyid, self.role = read_head(where, store)
        except ValueError as exc:
            self.problem = str(exc)

    def see(self, index: int, hash_: str, kind: str) -> None:
        """Remember the (hash, kind) of the entry the head ends at."""
        if index == self.entries - 1:
            self.covered = (hash_, kind)

    def fault(self, count: int, end_line: int) -> LedgerFault | None:
        """The head's fault against a ledger of ``count`` entries, or None."""
        problem = self.problem or check_head(self.where, count, self.covered, self.entries, self.head, self.role)
        return LedgerFault(end_line, None, self.label + problem) if problem else None

    def describe(self) -> str:
        """The line the report prints for a head that holds."""
        return f"signed head: {self.entries} entries, head {self.head[:23]}..., key {self.keyid[:16]}..."


def _walk(path: str | os.PathLike[str], key: bytes | None, require_end: bool, heads: list[_Head],
          store: TrustStore, certificates: bool = True) -> tuple[_LedgerWalk, list[LedgerFault]]:
    """One streaming pass over the ledger (one line in memory at a time): the walk and its end/head faults.

    A complete receipt line that ``scan_receipt`` reads and ``clean_receipt`` takes is done; every other line
    (another kind, anything non-canonical, any fault) is read by ``ledger_line`` and checked by ``check``.
    """
    walk = _LedgerWalk(key, store, certificates)
    torn: tuple[int, str] | None = None
    problems = 0
    try:  # a regular file, never through a link, never blocking on a planted FIFO or device
        opened: Any = open_regular(path, what="ledger") if os.path.lexists(path) else contextlib.nullcontext()
    except OSError as exc:
        walk.add(LedgerFault(1, None, str(exc)))
        opened, problems = contextlib.nullcontext(), 1
    with opened as handle:
        if handle is not None:
            for number, data in bounded_lines(handle, LEDGER_LINE_LIMITS.max_bytes):
                walk.last_line = number
                if not isinstance(data, bytes):
                    line = overlong_line(data, number)
                else:
                    scan = scan_receipt(data) if data.endswith(b"\n") else None
                    if scan is not None and walk.clean_receipt(walk.count, scan):
                        for head in heads:
                            head.see(walk.count, scan.hash, "receipt")
                        walk.count += 1
                        continue
                    line = ledger_line(data, number, raw=True)
                if line.torn:
                    torn = (line.number, line.problem or "torn last line")
                if line.entry is None:
                    if not line.torn:
                        problems += 1
                        walk.add(LedgerFault(line.number, None, line.problem or "not a ledger entry"))
                    continue
                for head in heads:
                    head.see(walk.count, line.entry.hash, line.entry.kind)
                walk.check(walk.count, line.number, line.entry)
                walk.count += 1
    faults = _end_faults(walk, torn, problems, require_end)
    faults += [f for f in (head.fault(walk.count, walk.last_line + 1) for head in heads) if f is not None]
    return walk, faults


def verify_ledger(path: str | os.PathLike[str], *, key: bytes | None = None, require_end: bool = True,
                  head: bool = True, since: str | os.PathLike[str] | None = None,
                  trust_store: TrustStore | None = None) -> LedgerReport:
    """Check every entry of the ledger at ``path``, its seals and (``head``) its signed head; see ``LedgerReport``.

    ``since``: a signed head recorded earlier (a copy of ``<ledger>.head``); the ledger must extend it.
    The ledger is read one line at a time: memory does not grow with it.
    """
    store = trust_store or TrustStore()
    heads = ([_Head(head_path(path), "", store)] if head else []) + \
        ([_Head(since, "--since ", store)] if since is not None else [])
    walk, end_faults = _walk(path, key, require_end, heads, store)
    faults = sorted(walk.faults + end_faults, key=lambda f: f.line)
    warnings = list(walk.warnings)
    if walk.dropped:
        warnings.append(f"{walk.dropped} more fault(s) not listed (a report keeps the first {MAX_FAULTS})")
    own = heads[0] if head else None
    if own is not None and own.problem is None and own.entries < walk.count:
        warnings.append(f"the last {walk.count - own.entries} entries come after the signed head: no key vouches "
                        "for them yet (a crash between an append and its head?)")
    signed_head = own.describe() if own is not None and own.fault(walk.count, 0) is None else ""
    return LedgerReport(str(path), walk.count, walk.counts["run_start"], walk.counts["receipt"],
                        walk.counts["audit"], walk.keyed, tuple(faults), tuple(warnings), signed_head,
                        walk.unverified_runs, walk.unchecked_runs)


def verify_for_append(path: str | os.PathLike[str], *, key: bytes | None,
                      trust_store: TrustStore | None = None) -> tuple[int, str, str | None]:
    """Before a writer appends: the whole chain and the signed head must verify and the head must cover every
    entry; returns (next seq, last hash, the open run's certificate). ``LedgerError`` otherwise, so a rewritten
    or truncated ledger is refused before a new run could seal it."""
    store = trust_store or TrustStore()
    own = _Head(head_path(path), "", store)
    walk, end_faults = _walk(path, key, False, [own], store, certificates=False)
    faults = sorted(walk.faults + end_faults, key=lambda f: f.line)
    if faults:
        raise LedgerError(f"{path}: refusing to append: {faults[0]}; run `mixle-parallel audit {path}`")
    if own.entries != walk.count:
        raise LedgerError(
            f"{path}: refusing to append: its last {walk.count - own.entries} entries come after the signed head "
            f"({head_path(path)}), so no key vouches for them (a crash between an append and its head, or an "
            "edit); inspect them with `mixle-parallel audit`, and remove them on purpose or start a new ledger")
    certificate = walk.run.certificate if walk.run is not None else None
    return walk.count, walk.prev_hash, certificate


def main_audit(argv: Sequence[str] | None = None) -> int:
    """``mixle-parallel audit LEDGER``: verify a ledger, print the verdict, exit 1 on any fault."""
    parser = argparse.ArgumentParser(prog="mixle-parallel audit", description=main_audit.__doc__)
    parser.add_argument("ledger", help="path to a ledger .jsonl file")
    parser.add_argument(
        "--key-file", default=None, help=f"HMAC key file (else {KEY_ENV['ledger'][0]} or {KEY_ENV['ledger'][1]})"
    )
    parser.add_argument("--allow-open", action="store_true", help="accept a last run without run_end")
    parser.add_argument("--since", default=None, metavar="HEAD",
                        help="a signed head recorded earlier (a copy of LEDGER.head): the ledger must extend it")
    parser.add_argument("--no-head", action="store_true", help="do not require the signed head LEDGER.head")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not os.path.lexists(args.ledger):  # a link, FIFO or device there is a FAULT of the report, never a hang
        print(f"mixle-parallel audit: no ledger file at {args.ledger!r}", file=sys.stderr)
        return 2
    try:
        key = load_key(key_file=args.key_file, purpose="ledger")
    except (OSError, ValueError) as exc:
        print(f"mixle-parallel audit: {exc}", file=sys.stderr)
        return 2
    report = verify_ledger(args.ledger, key=key, require_end=not args.allow_open, head=not args.no_head,
                           since=args.since)
    if args.json:
        data = attrs.asdict(report)
        data["ok"] = report.ok
        print(json.dumps(data, indent=2, default=str))
    else:
        print(report.summary())
        for warning in report.warnings:
            print(f"warning: {warning}")
    return 0 if report.ok else 1
