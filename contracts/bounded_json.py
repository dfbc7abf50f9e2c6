"""Untrusted JSON, bounded before it is decoded: the one strict parser for signed and hashed documents.

Every document that arrives from storage or another machine (certificate envelopes and their
payloads, ledger seals and head files, checkpoint manifests, pointers, state files and their
signatures, checkpoint high-water records, trust store files, ledger lines, contract documents) is
read through ``parse_json`` (or ``parse_object``, which also refuses a top level that is not an
object) with the ``DocumentLimits`` of its kind; files are read by ``read_limited``, which opens
only regular files, never through a link and never blocking (``safe_read``):

1. its size is checked before a byte is decoded (``max_bytes``; ``read_limited`` never reads past it);
2. it must be UTF-8 JSON with no duplicate object keys and, unless the kind allows them, no
   ``NaN``/``Infinity`` tokens;
3. its shape is checked before anything structures it: nesting depth, the number of items (array
   elements plus object members, counted until the limit is passed, then the walk stops), integer
   magnitude and strings encodable as UTF-8.

``parse_canonical`` is a fast path for lines this library wrote itself (the ledger audit reads
millions): it returns a document only when all of the above provably hold for it, else None, and the
caller decodes with ``parse_json``.

The first fault raises ``DocumentLimitError`` (a ``ContractError``: the message names the document
kind, the limit and the JSON path); nothing later is decoded. Structuring into contracts (the
converter in ``serialization``) also stops at its first fault, and caps the number of signatures
per DSSE envelope at ``MAX_SIGNATURES`` before any signature is looked at.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import attrs

from .errors import ContractError
from .safe_read import OversizeFileError, read_regular

__all__ = [
    "CHECKPOINT_RECORD_LIMITS", "CHECKPOINT_STATE_LIMITS", "CONTRACT_LIMITS", "LEDGER_LINE_LIMITS", "MANIFEST_LIMITS",
    "MANIFEST_SIGNATURE_LIMITS", "MAX_DEPTH", "MAX_INT", "MAX_SIGNATURES", "SIGNED_LIMITS", "TRUST_FILE_LIMITS",
    "DocumentLimitError", "DocumentLimits", "check_shape", "parse_canonical", "parse_json", "parse_object",
    "read_limited",
]

MAX_DEPTH = 64
"""Deepest nesting of arrays/objects a document may have (contracts nest a handful of levels)."""

MAX_INT = 2**63 - 1
"""Largest integer magnitude a document may hold (no contract field needs more; 4,300-digit ints are refused)."""

MAX_SIGNATURES = 8
"""Most signatures one DSSE envelope may carry (certificates, seals, heads, manifest signatures); more is refused
before any is structured or verified."""


class DocumentLimitError(ContractError):
    """An untrusted document is too large, too deep, has too many items, or is not strict JSON."""


def _positive(inst: object, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"DocumentLimits.{attribute.name}={value!r}; expected a positive integer")


@attrs.frozen
class DocumentLimits:
    """The bounds one kind of untrusted document is checked against before it is decoded."""

    what: str = attrs.field(validator=attrs.validators.instance_of(str))
    """The kind, as messages name it ("certificate envelope", "ledger line", ...)."""
    max_bytes: int = attrs.field(validator=_positive)
    """Largest encoded size (UTF-8 bytes); checked before decoding."""
    max_items: int = attrs.field(validator=_positive)
    """Most array elements plus object members in the whole document."""
    max_depth: int = attrs.field(default=MAX_DEPTH, validator=_positive)
    """Deepest nesting of arrays and objects."""
    allow_nonfinite: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    """Whether ``NaN``/``Infinity``/``-Infinity`` tokens are accepted (contract documents: a skipped step's loss)."""
    max_int: int = attrs.field(default=MAX_INT, validator=_positive)
    """Largest integer magnitude (checkpoint state holds 64-bit RNG seeds up to ``2**64 - 1``)."""

    def describe(self) -> str:
        """The limits in one line, for documentation and messages."""
        return (f"{self.what}: at most {self.max_bytes:,} bytes, {self.max_items:,} items, depth {self.max_depth}"
                f"{', NaN/Infinity allowed' if self.allow_nonfinite else ''}")


SIGNED_LIMITS = DocumentLimits("signed document", max_bytes=1 << 20, max_items=100_000)
"""DSSE envelopes (certificates, ledger seals and head files, checkpoint manifest signatures) and their payloads."""

CONTRACT_LIMITS = DocumentLimits("contract document", max_bytes=16 << 20, max_items=1_000_000, allow_nonfinite=True)
"""``from_json`` of any contract (plans, resources, calibration catalogs, receipts: a NaN loss is a real value)."""

LEDGER_LINE_LIMITS = DocumentLimits("ledger line", max_bytes=4 << 20, max_items=200_000)
"""One JSON Lines entry of a ledger (a run_start carries a certificate envelope)."""

MANIFEST_LIMITS = DocumentLimits("checkpoint manifest", max_bytes=64 << 20, max_items=2_000_000)
"""A checkpoint generation's ``MANIFEST.json`` (one digest per file of every rank)."""

MANIFEST_SIGNATURE_LIMITS = DocumentLimits("checkpoint manifest signature", max_bytes=16 << 10, max_items=1_000)
"""A generation's ``MANIFEST.sig`` (one DSSE envelope of about 1.5 KB): tight, so a load that looks at planted
``gen-*`` folders refuses each oversized signature from its size alone."""

CHECKPOINT_STATE_LIMITS = DocumentLimits("checkpoint state document", max_bytes=1 << 30, max_items=50_000_000,
                                         max_int=2**64 - 1)
"""A generation's ``state.json`` and ``ranks/rank-R.json`` (hashed in its manifest; user ``extra`` and inline
tensors make them large): strict JSON, sized by the manifest's record before it is read."""

CHECKPOINT_RECORD_LIMITS = DocumentLimits("checkpoint high-water record", max_bytes=64 << 10, max_items=64)
"""A trust store's per-run and per-root checkpoint records (``<home>/checkpoints/*.json``): a handful of fields."""

TRUST_FILE_LIMITS = DocumentLimits("trust store file", max_bytes=1 << 20, max_items=100_000)
"""``trust.json`` and ``policy.json`` of the trust store."""


def _too_large(limits: DocumentLimits, size: int | str, what: str | None) -> DocumentLimitError:
    return DocumentLimitError(f"{what or limits.what} is {size} bytes, over the limit of {limits.max_bytes:,} "
                              "bytes; refused before decoding", path="$")


def read_limited(path: str | os.PathLike[str], limits: DocumentLimits, *, what: str | None = None,
                 follow_symlinks: bool = False) -> bytes:
    """The bytes of the regular file ``path``, refused (``DocumentLimitError``) without reading past
    ``limits.max_bytes``; read through ``safe_read.read_regular``.

    A link, FIFO, device, socket or folder is ``UnsafeFileError`` (an ``OSError``) naming the path, before a byte
    is read; ``follow_symlinks=True`` (a path a person typed) follows a link to a regular file.
    """
    name = what or f"{limits.what} {os.fspath(path)}"
    try:
        return read_regular(path, limits.max_bytes, what=limits.what, follow_symlinks=follow_symlinks)
    except OversizeFileError as exc:
        raise _too_large(limits, f"{exc.size:,}" if exc.size is not None else f"more than {limits.max_bytes:,}",
                         name) from None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        out[key] = value
    return out


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON (RFC 8259 has no NaN or Infinity)")


def _as_text(data: Any, limits: DocumentLimits, what: str | None) -> str:
    name = what or limits.what
    if isinstance(data, str):
        if len(data) > limits.max_bytes:  # every character is at least one UTF-8 byte
            raise _too_large(limits, f"at least {len(data):,}", what)
        try:
            encoded = len(data.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise DocumentLimitError(f"{name} holds a lone surrogate at index {exc.start}", path="$") from None
        if encoded > limits.max_bytes:
            raise _too_large(limits, f"{encoded:,}", what)
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        if len(raw) > limits.max_bytes:
            raise _too_large(limits, f"{len(raw):,}", what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentLimitError(f"{name} is not UTF-8 text: {exc}", path="$") from None
    raise DocumentLimitError(f"{name}: expected JSON text (str or bytes), got {type(data).__name__}", path="$")


def parse_json(data: str | bytes | bytearray | memoryview, limits: DocumentLimits = CONTRACT_LIMITS, *,
               what: str | None = None) -> Any:
    """Decode untrusted JSON under ``limits``: size first, then strict JSON, then the shape; first fault raises.

    ``what`` names the document in messages (default: ``limits.what``). Raises ``DocumentLimitError``
    for every fault, including wrong input types (``None``, an int, a dict).
    """
    text = _as_text(data, limits, what)
    hooks: dict[str, Any] = {"object_pairs_hook": _pairs}
    if not limits.allow_nonfinite:
        hooks["parse_constant"] = _refuse_constant
    try:
        document = json.loads(text, **hooks)
    except RecursionError:
        raise DocumentLimitError(f"{what or limits.what} nests deeper than {limits.max_depth} levels",
                                 path="$") from None
    except ValueError as exc:
        raise DocumentLimitError(f"{what or limits.what} is not valid JSON: {exc}", path="$") from None
    check_shape(document, limits, what=what)
    return document


def parse_object(data: str | bytes | bytearray | memoryview, limits: DocumentLimits, *,
                 what: str | None = None) -> dict[str, Any]:
    """``parse_json`` of a document whose top level must be a JSON object (every signed or hashed document this
    library writes is one); an array, string or number at the top is ``DocumentLimitError``."""
    document = parse_json(data, limits, what=what)
    if not isinstance(document, dict):
        raise DocumentLimitError(f"{what or limits.what} must be a JSON object at the top level, not "
                                 f"{type(document).__name__}", path="$")
    return document


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
"""The one encoding ``parse_canonical`` accepts: sorted keys, no spaces, ASCII, strict (what a ledger writes)."""

_LONG_INT = re.compile(rb"[\[:,]-?[0-9]{19}")
"""A number token of 19 or more digits (the first that can pass ``MAX_INT``); a string holding one also matches."""
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_DIGIT_RUN = b"0" * 19


def _long_int(line: bytes) -> bool:
    """Whether ``line`` may hold a 19-digit number token (a cheap scan for 19 digits in a row decides most lines)."""
    digits = line.translate(_DIGITS_AS_ZERO)
    if _DIGIT_RUN not in digits:
        return False
    starts = (b":" + _DIGIT_RUN, b"," + _DIGIT_RUN, b"[" + _DIGIT_RUN, b"-" + _DIGIT_RUN)
    return any(start in digits for start in starts) and _LONG_INT.search(line) is not None


def parse_canonical(line: bytes, limits: DocumentLimits) -> Any | None:
    """The object or array ``line`` encodes when it is canonical JSON and provably within ``limits``; else None.

    The fast path for documents this library writes itself (ledger lines): one C decode, one C re-encode,
    and counts over the bytes instead of a walk. It returns a document only where ``parse_json`` would
    return the same one: the line (one trailing newline allowed) must equal the compact, sorted-key,
    ASCII, NaN-free encoding of what it decodes to, so no key repeats (the re-encoding would have fewer
    members), no ``NaN``/``Infinity`` and no non-canonical spelling passes. It holds no ``\\u`` escape
    (so no lone surrogate), no 19-digit number token (so no integer past ``MAX_INT``), no more ``[``/``{``
    than ``max_depth`` and no more items than ``max_items`` (each bounded above by counting bytes).
    None means "not shown to hold": decode with ``parse_json``, which finds and names the fault, if any.
    """
    if len(line) > limits.max_bytes or not line.isascii() or b"\\u" in line or _long_int(line):
        return None
    text = line[:-1] if line.endswith(b"\n") else line
    containers = text.count(b"{") + text.count(b"[")
    if containers > limits.max_depth:  # nesting is at most the number of containers
        return None
    if len(text) > limits.max_items and text.count(b",") + containers > limits.max_items:
        return None  # items <= commas + non-empty containers, and <= characters
    decoded = text.decode("ascii")
    try:
        document = json.loads(decoded)
        canonical = type(document) in (dict, list) and _CANONICAL.encode(document) == decoded
    except (ValueError, RecursionError):
        return None
    return document if canonical else None


def _path(parts: tuple[Any, ...] | None, root: str) -> str:
    """The JSON path of a linked (parent, key) chain, built only when a fault is reported."""
    keys: list[Any] = []
    while parts is not None:
        parts, key = parts
        keys.append(key)
    text = root
    for key in reversed(keys):
        text += f"[{key}]" if isinstance(key, int) else f".{key}"
    return text


def _utf8_fault(value: str) -> str | None:
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"string holds a lone surrogate at index {exc.start} (not encodable as UTF-8)"
    return None


def _scalar_fault(value: Any, bound: int = MAX_INT) -> str | None:
    kind = type(value)
    if kind is float or kind is bool or value is None:
        return None
    if isinstance(value, str):
        return _utf8_fault(value)
    if isinstance(value, int) and not isinstance(value, bool) and (value > bound or value < -bound):
        text = f"2**{bound.bit_length()}-1" if (bound + 1) & bound == 0 else f"{bound}"
        return f"integer beyond the bound {text} ({len(str(abs(value)))} digits)"
    return None


def _is_container(value: Any) -> bool:
    kind = type(value)
    return kind is dict or kind is list or kind is tuple or isinstance(value, (Mapping, list, tuple))


def check_shape(document: Any, limits: DocumentLimits = CONTRACT_LIMITS, *, what: str | None = None,
                path: str = "$") -> None:
    """Depth, item count, integer bounds and UTF-8 of an already-decoded document.

    Iterative, and stops at the first fault (an item count over the limit stops the walk at once).
    Scalars are checked where they stand; only containers are queued, and a path is built only for a fault.
    """
    name = what or limits.what
    items, bound = 0, limits.max_int
    stack: list[tuple[Any, tuple[Any, ...] | None, int]] = [(document, None, 0)] if _is_container(document) else []
    if not stack:
        fault = _scalar_fault(document, limits.max_int)
        if fault:
            raise DocumentLimitError(fault, path=path)
    while stack:
        value, where, depth = stack.pop()
        if depth >= limits.max_depth:
            raise DocumentLimitError(f"{name} nests deeper than {limits.max_depth} levels", path=_path(where, path))
        items += len(value)
        if items > limits.max_items:
            raise DocumentLimitError(f"{name} has more than {limits.max_items:,} items (array elements and "
                                     "object members); refused before decoding its contents", path=path)
        if isinstance(value, (list, tuple)):
            members: Any = enumerate(value)
        else:
            members = value.items()
            for key in value:
                fault = f"object key {key!r} is not a string" if not isinstance(key, str) else _utf8_fault(key)
                if fault:
                    raise DocumentLimitError(f"object key: {fault}", path=_path(where, path))
        for key, item in members:  # inlined: this loop runs once per item of an untrusted document
            kind = type(item)
            if kind is int:
                if item > bound or item < -bound:
                    raise DocumentLimitError(_scalar_fault(item, bound) or "", path=_path((where, key), path))
            elif kind is str:
                if not item.isascii() and _utf8_fault(item):
                    raise DocumentLimitError(_utf8_fault(item) or "", path=_path((where, key), path))
            elif kind is float or kind is bool or item is None:
                continue
            elif kind is dict or kind is list or kind is tuple or _is_container(item):
                stack.append((item, (where, key), depth + 1))
            else:
                fault = _scalar_fault(item, bound)
                if fault:
                    raise DocumentLimitError(fault, path=_path((where, key), path))
