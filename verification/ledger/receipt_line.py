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
path can only accept what the strict one accepts, the same way.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from ...contracts.bounded_json import LEDGER_LINE_LIMITS, parse_canonical
from ...contracts.receipts import StepReceipt
from ...contracts.serialization import SCHEMA_VERSION

__all__ = ["match_receipt"]

_STR = rb'"([\x20\x21\x23-\x5b\x5d-\x7e]*)"'  # printable ASCII but '"' and '\': JSON decoding is the identity
_INT = rb"(0|-?[1-9][0-9]{0,17})"  # canonical (no "-0", no leading zero), below 2**63-1
_NUMBER = rb"(null|-?[0-9][0-9.e+-]*)"  # checked further in Python: an int as _INT, a float as its repr
_OPTIONAL_INT = rb"(null|0|-?[1-9][0-9]{0,17})"
_BOOL = rb"(true|false)"
_OBJECT = rb"(\{[^{}\[\]]*\})"  # no nested container; parse_canonical decodes and checks it
_INT_TOKEN = re.compile(_INT)


class _NotCanonical(Exception):
    """A token matched the pattern's shape but is not its own canonical encoding."""



def _number(token: bytes) -> int | float | None:
    """A loss token as ``json.loads`` decodes it: null, an int, or a float written exactly as its ``repr``."""
    if token == b"null":
        return None
    if _INT_TOKEN.fullmatch(token):
        return int(token)
    try:
        value = float(token)
    except ValueError:
        raise _NotCanonical from None
    if repr(value).encode("ascii") != token:  # "1.50", "1E5", "1e400" (inf) are not canonical
        raise _NotCanonical
    return value


def _object(token: bytes) -> dict[str, Any]:
    """A flat ``extra`` object, decoded and checked by ``parse_canonical``."""
    decoded = parse_canonical(token, LEDGER_LINE_LIMITS)
    if type(decoded) is not dict:
        raise _NotCanonical
    return decoded


_FIELD_PATTERNS = {
    "step": _INT, "local_examples": _INT, "local_tokens": _INT, "microbatches": _INT, "accumulation_steps": _INT,
    "data_parallel_size": _INT, "collective_bytes": _INT, "loss": _NUMBER, "optimizer": _STR, "precision": _STR,
    "skipped": _BOOL, "extra": _OBJECT, "global_examples_observed": _OPTIONAL_INT,
    "global_tokens_observed": _OPTIONAL_INT,
}
"""Each StepReceipt field's token; ``match_receipt`` unpacks them in sorted order (the canonical key order)."""
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


def match_receipt(line: bytes) -> tuple[dict[str, Any], bytes] | None:
    """(the record ``json.loads`` would give, the canonical bytes its hash covers) of a canonical receipt line.

    None when the line is not provably one (decode it with ``parse_json`` then).
    """
    found = RECEIPT_LINE.fullmatch(line) if RECEIPT_LINE is not None and len(line) <= _MAX_LINE else None
    if found is None:
        return None
    (certificate, _, outer_extra, rank, accumulation_steps, collective_bytes, data_parallel_size, extra,
     global_examples, global_tokens, local_examples, local_tokens, loss, microbatches, optimizer, precision,
     skipped, step, payload_step, prev, seq, time) = found.groups()
    try:
        data = {"accumulation_steps": int(accumulation_steps), "collective_bytes": int(collective_bytes),
                "data_parallel_size": int(data_parallel_size), "extra": {} if extra == b"{}" else _object(extra),
                "global_examples_observed": None if global_examples == b"null" else int(global_examples),
                "global_tokens_observed": None if global_tokens == b"null" else int(global_tokens),
                "local_examples": int(local_examples),
                "local_tokens": int(local_tokens), "loss": _number(loss), "microbatches": int(microbatches),
                "optimizer": optimizer.decode("ascii"), "precision": precision.decode("ascii"),
                "skipped": skipped == b"true", "step": int(step)}
        payload = {"extra": {} if outer_extra == b"{}" else _object(outer_extra), "rank": int(rank),
                   "receipt": {"data": data, "kind": "StepReceipt", "version": SCHEMA_VERSION},
                   "step": int(payload_step)}
    except _NotCanonical:
        return None
    number = int(seq)
    if not 0 <= number < 2**53:  # the strict path names the fault
        return None
    cut, end = found.start(2) - len(b',"hash":"'), found.end(2) + 1
    record = {"certificate": certificate.decode("ascii"), "hash": found[2].decode("ascii"), "kind": "receipt",
              "payload": payload, "prev": prev.decode("ascii"), "seq": number, "time": time.decode("ascii")}
    return record, line[:cut] + line[end:len(line) - line.endswith(b"\n")]
