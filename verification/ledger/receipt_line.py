"""A ledger's commonest line, one rank's receipt, read by one compiled pattern instead of a JSON decode.

A ledger is almost all receipt lines, each written by ``Ledger.receipt`` in one canonical form
(sorted keys, no spaces, ASCII). ``match_receipt`` accepts a line only when it is exactly that form,
token by token: the fixed keys in their order, strings of printable ASCII without escapes, integers of
at most 18 digits without a leading zero (under ``MAX_INT``), a loss spelled as Python's ``repr`` (so
finite), ``extra`` objects that ``parse_canonical`` accepts, and a line no longer than the ledger
line's item limit (so no size, depth or item limit can be passed). Such a line decodes to exactly what
``json.loads`` gives, it is its own canonical encoding (no repeated key, no ``NaN``), and the bytes the
hash covers are the line without its ``hash`` member. Anything else (another kind, an escape, a nested
``extra``, a field StepReceipt gains later) returns None and the strict parser reads the line: this
path can only accept what the strict one accepts, the same way. ``scan_receipt`` is the same match for the
audit: it returns only the fields the audit compares (no record dicts), so a clean receipt costs one match,
one hash and a few comparisons.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import attrs

from ...contracts.bounded_json import LEDGER_LINE_LIMITS, parse_canonical
from ...contracts.receipts import StepReceipt
from ...contracts.serialization import SCHEMA_VERSION

__all__ = ["RECEIPT_LINE", "ReceiptLine", "ReceiptScan", "match_receipt", "scan_receipt"]

_STR = rb'"([\x20\x21\x23-\x5b\x5d-\x7e]*)"'  # printable ASCII but '"' and '\': JSON decoding is the identity
_INT = rb"(0|-?[1-9][0-9]{0,17})"  # canonical (no "-0", no leading zero), below 2**63-1
_NUMBER = rb"(-?[0-9][0-9.e+-]*)"  # checked further in Python: an int as _INT, a float as its repr (null: strictly)
_NON_NEGATIVE = rb"(0|[1-9][0-9]{0,17})"  # StepReceipt's non_negative_int, within MAX_INT
_POSITIVE = rb"([1-9][0-9]{0,17})"  # positive_int
_OPTIONAL_INT = rb"(null|0|[1-9][0-9]{0,17})"  # optional_non_negative_int
_NON_BLANK = rb'"( *[\x21\x23-\x5b\x5d-\x7e][\x20\x21\x23-\x5b\x5d-\x7e]*)"'  # non_empty_str: not only spaces
_BOOL = rb"(true|false)"
_OBJECT = rb"(\{[^{}\[\]]*\})"  # no nested container; parse_canonical decodes and checks it
_RATES = rb"(\[[-0-9.e+,]*\])"  # a flat list of numbers; each checked further in Python (a float as its repr, >= 0)
_INT_TOKEN = re.compile(_INT)


class _NotCanonical(Exception):
    """A token matched the pattern's shape but is not its own canonical encoding."""



def _number(token: bytes) -> int | float:
    """A loss token as ``json.loads`` decodes it: an int, or a float written exactly as its ``repr``."""
    if b"." not in token and b"e" not in token:
        if _INT_TOKEN.fullmatch(token) is None:
            raise _NotCanonical
        return int(token)
    try:
        value = float(token)
    except ValueError:
        raise _NotCanonical from None
    if repr(value).encode("ascii") != token:  # "1.50", "1E5", "1e400" (inf) are not canonical
        raise _NotCanonical
    return value


def _rates(token: bytes) -> list[float]:
    """A ``learning_rates`` token as ``json.loads`` decodes it: floats written exactly as their ``repr``, each
    finite and >= 0 (StepReceipt's validator); anything else (an int, ``1e400``) takes the strict path."""
    if token == b"[]":
        return []
    values = []
    for item in token[1:-1].split(b","):
        value = _number(item)
        if type(value) is not float or not value >= 0:
            raise _NotCanonical
        values.append(value)
    return values


def _object(token: bytes) -> dict[str, Any]:
    """A flat ``extra`` object, decoded and checked by ``parse_canonical``."""
    decoded = parse_canonical(token, LEDGER_LINE_LIMITS)
    if type(decoded) is not dict:
        raise _NotCanonical
    return decoded


_FIELD_PATTERNS = {
    "step": _NON_NEGATIVE, "local_examples": _NON_NEGATIVE, "local_tokens": _NON_NEGATIVE,
    "microbatches": _POSITIVE, "accumulation_steps": _POSITIVE, "data_parallel_size": _POSITIVE,
    "collective_bytes": _NON_NEGATIVE, "loss": _NUMBER, "optimizer": _NON_BLANK, "precision": _NON_BLANK,
    "skipped": _BOOL, "extra": _OBJECT, "global_examples_observed": _OPTIONAL_INT,
    "global_tokens_observed": _OPTIONAL_INT, "learning_rates": _RATES,
}
"""Each StepReceipt field's token, within the range its validator accepts; ``match_receipt`` unpacks them in
sorted order (the canonical key order) and checks the one rule across fields (observed global >= local)."""
_DATA_FIELDS = tuple(sorted(field.name for field in attrs.fields(StepReceipt)))


def _compile() -> re.Pattern[bytes] | None:
    """The whole canonical receipt line; None if StepReceipt's fields are not the ones this module knows."""
    if set(_DATA_FIELDS) != set(_FIELD_PATTERNS):
        return None
    data = b",".join(b'"%s":%s' % (name.encode(), _FIELD_PATTERNS[name]) for name in _DATA_FIELDS)
    return re.compile(
        rb'\{"certificate":' + _STR + rb',"hash":' + _STR + rb',"kind":"receipt","payload":\{"extra":' + _OBJECT
        + rb',"rank":' + _INT + rb',"receipt":\{"data":\{' + data + rb'\},"kind":"StepReceipt","version":'
        + str(SCHEMA_VERSION).encode() + rb'\},"step":' + _INT + rb'\},"prev":' + _STR + rb',"seq":' + _INT
        + rb',"time":' + _STR + rb"\}\n?")


RECEIPT_LINE = _compile()
"""The compiled pattern (None when StepReceipt has a field it does not know: every line then takes the strict path)."""

_MAX_LINE = min(LEDGER_LINE_LIMITS.max_bytes, LEDGER_LINE_LIMITS.max_items)
"""Longest line the pattern may take: every item takes at least one byte, so no limit can be passed."""


class ReceiptLine(NamedTuple):
    """What ``match_receipt`` read: the record, the bytes its hash covers, and the receipt's checked facts."""

    record: dict[str, Any]
    """Exactly what ``json.loads`` gives for the line."""
    canonical: bytes
    """The canonical encoding of every field but ``hash`` (the line less its ``hash`` member)."""
    facts: tuple[int, bool, dict[str, Any]]
    """(step, skipped, extra) of a receipt that passes every StepReceipt validator, as ``receipt_facts`` gives."""


class ReceiptScan(NamedTuple):
    """What the audit checks of a receipt line ``scan_receipt`` proved canonical and valid, without its record.

    The audit reads millions of these: no payload dicts are built, only the fields its checks compare.
    """

    certificate: str
    hash: str
    prev: str
    seq: int
    rank: int
    """The payload's ``rank``."""
    payload_step: int
    """The payload's ``step`` (the audit checks it equals the receipt's)."""
    step: int
    skipped: bool
    extra: dict[str, Any]
    """The receipt's ``extra`` (the payload's own ``extra`` is checked to be canonical JSON, then dropped)."""
    canonical: bytes
    """The canonical encoding of every field but ``hash`` (the line less its ``hash`` member)."""


def _valid(line: bytes) -> tuple[re.Match[bytes], dict[str, Any], dict[str, Any], int | float, list[float]] | None:
    """The match of a canonical receipt line whose every token and receipt rule holds: with the receipt's
    decoded ``extra``, the payload's ``extra``, the loss and the learning rates. None when the line is not
    provably one."""
    found = RECEIPT_LINE.fullmatch(line) if RECEIPT_LINE is not None and len(line) <= _MAX_LINE else None
    if found is None:
        return None
    outer, seen_examples, seen_tokens, rates, local_examples, local_tokens, loss = found.group(3, 9, 10, 11, 12, 13,
                                                                                              14)
    try:
        inner = {} if found[8] == b"{}" else _object(found[8])
        payload_extra = {} if outer == b"{}" else _object(outer)
        value = _number(loss)
        learning_rates = _rates(rates)
    except _NotCanonical:
        return None
    if ((seen_examples != b"null" and int(seen_examples) < int(local_examples))
            or (seen_tokens != b"null" and int(seen_tokens) < int(local_tokens)) or not 0 <= int(found[22]) < 2**53):
        return None  # the strict path names the fault
    return found, inner, payload_extra, value, learning_rates


_HASH_KEY = len(b',"hash":"')
"""Bytes between the end of the ``certificate`` value and the start of the ``hash`` value."""


def _canonical(line: bytes, found: re.Match[bytes]) -> bytes:
    """The line without its ``hash`` member (and newline): the bytes its hash covers."""
    start, end = found.span(2)
    return line[:start - _HASH_KEY] + line[end + 1:len(line) - (line[-1:] == b"\n")]


def scan_receipt(line: bytes) -> ReceiptScan | None:
    """What the audit checks of a canonical receipt line whose receipt is valid; None when the line is not
    provably one (read it with ``match_receipt`` or the strict parser then: they name any fault)."""
    valid = _valid(line)
    if valid is None:
        return None
    found, inner, _, _, _ = valid
    certificate, hash_, rank, skipped, step, payload_step, prev, seq = found.group(1, 2, 4, 18, 19, 20, 21, 22)
    return tuple.__new__(ReceiptScan, (  # the tuple itself: a NamedTuple's __new__ is a Python call, a million times
        certificate.decode("ascii"), hash_.decode("ascii"), prev.decode("ascii"), int(seq), int(rank),
        int(payload_step), int(step), skipped == b"true", inner, _canonical(line, found)))


def match_receipt(line: bytes) -> ReceiptLine | None:
    """The record, hashed bytes and receipt facts of a canonical receipt line whose receipt is valid.

    None when the line is not provably one (decode it with ``parse_json`` then; it names any fault).
    """
    valid = _valid(line)
    if valid is None:
        return None
    found, inner, outer_extra, loss, learning_rates = valid
    (certificate, hash_, _, rank, accumulation_steps, collective_bytes, data_parallel_size, _, global_examples,
     global_tokens, _, local_examples, local_tokens, _, microbatches, optimizer, precision, skipped, step,
     payload_step, prev, seq, time) = found.groups()
    data: dict[str, Any] = {
        "accumulation_steps": int(accumulation_steps), "collective_bytes": int(collective_bytes),
        "data_parallel_size": int(data_parallel_size), "extra": inner,
        "global_examples_observed": None if global_examples == b"null" else int(global_examples),
        "global_tokens_observed": None if global_tokens == b"null" else int(global_tokens),
        "learning_rates": learning_rates, "local_examples": int(local_examples),
        "local_tokens": int(local_tokens), "loss": loss,
        "microbatches": int(microbatches), "optimizer": optimizer.decode("ascii"),
        "precision": precision.decode("ascii"), "skipped": skipped == b"true", "step": int(step)}
    payload = {"extra": outer_extra, "rank": int(rank),
               "receipt": {"data": data, "kind": "StepReceipt", "version": SCHEMA_VERSION}, "step": int(payload_step)}
    record = {"certificate": certificate.decode("ascii"), "hash": hash_.decode("ascii"), "kind": "receipt",
              "payload": payload, "prev": prev.decode("ascii"), "seq": int(seq), "time": time.decode("ascii")}
    return ReceiptLine(record, _canonical(line, found), (data["step"], data["skipped"], inner))
