"""The one cattrs converter: versioned JSON envelopes, strict types, errors that name the field path."""

from __future__ import annotations

import enum
import hashlib
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    ClassValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn
from cattrs.v import format_exception

from .errors import ContractError
from .frozen_mapping import FrozenDict, thaw_json

T = TypeVar("T")

SCHEMA_VERSION = 1
"""Version written in every envelope; documents of another version are refused."""

MAX_DEPTH = 64
"""Deepest nesting of arrays/objects a document may have (contracts nest a handful of levels)."""

SCHEMA_METADATA = "json_schema"
"""attrs field metadata key: JSON Schema keywords (bounds, patterns) the field's validator enforces."""

MAX_INT = 2**63 - 1
"""Largest integer magnitude a document may hold (no contract field needs more; 4,300-digit ints are refused)."""

CONTRACT_TYPES: dict[str, type] = {}
"""Every contract that can travel as a JSON document, by kind name."""


def _is_attrs_class(cls: type) -> bool:
    return bool(attrs.has(cls))


def register_contract(cls: type[T]) -> type[T]:
    """Make an attrs class a document kind (its class name) of the one converter."""
    if not _is_attrs_class(cls):
        raise TypeError(f"{cls!r} is not an attrs class")
    current = CONTRACT_TYPES.get(cls.__name__)
    if current is not None and current is not cls:
        raise ValueError(f"contract kind {cls.__name__!r} is already registered to {current!r}")
    attrs.resolve_types(typing.cast(Any, cls))
    CONTRACT_TYPES[cls.__name__] = cls
    return cls




# ---- strict primitive hooks -----------------------------------------------------------------
def _type_error(expected: str, value: Any) -> TypeError:
    return TypeError(f"expected {expected}, got {type(value).__name__} ({value!r})")


def _structure_int(value: Any, _: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error("an integer", value)
    if abs(value) > MAX_INT:
        raise ValueError(f"integer beyond the bound 2**63-1 ({len(str(abs(value)))} digits)")
    return value


def _structure_float(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error("a number", value)
    return float(value)


def _structure_str(value: Any, _: type) -> str:
    if not isinstance(value, str):
        raise _type_error("a string", value)
    _utf8(value)
    return value


def _utf8(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"string holds a lone surrogate at index {exc.start} (not encodable as UTF-8)") from None


def _structure_bool(value: Any, _: type) -> bool:
    if not isinstance(value, bool):
        raise _type_error("true or false", value)
    return value


def _structure_frozen_dict(value: Any, _: type) -> FrozenDict:
    if not isinstance(value, Mapping):
        raise _type_error("an object", value)
    return FrozenDict(value)


def _is_sequence_type(tp: Any) -> bool:
    return typing.get_origin(tp) in (tuple, frozenset)


def _sequence_hook(converter: cattrs.Converter):  # noqa: ANN202 - hook factory
    def factory(tp: Any) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        homogeneous = origin is frozenset or (len(args) == 2 and args[1] is Ellipsis)
        item_types = [args[0]] if homogeneous else list(args)

        def structure(value: Any, _: Any) -> Any:
            if not isinstance(value, list):
                raise _type_error("an array", value)
            if not homogeneous and len(value) != len(item_types):
                raise ValueError(f"expected an array of {len(item_types)} items, got {len(value)}")
            items, errors = [], []
            for i, item in enumerate(value):
                item_type = item_types[0] if homogeneous else item_types[i]
                try:
                    items.append(converter.structure(item, item_type))
                except Exception as exc:  # noqa: BLE001 - re-raised with the index as a note
                    exc.__notes__ = [*getattr(exc, "__notes__", []),
                                      IterableValidationNote(f"Structuring item @ index {i}", i, item_type)]
                    errors.append(exc)
            if errors:
                raise cattrs.IterableValidationError(f"while structuring {tp!r}", errors, tp)
            return frozenset(items) if origin is frozenset else tuple(items)

        return structure

    return factory


def _all_fields_required(converter: cattrs.Converter):  # noqa: ANN202 - hook factory
    """Documents spell out every field, defaults included: a missing key is an error, not a default."""

    def factory(cls: type) -> Any:
        attrs.resolve_types(cls)
        generated: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True)
        names = [f.name for f in attrs.fields(cls) if f.init]

        def structure(value: Any, _: Any) -> Any:
            if not isinstance(value, Mapping):
                raise _type_error(f"a {cls.__name__} object", value)
            missing = [n for n in names if n not in value]
            if missing:
                errors = []
                for name in missing:
                    exc = KeyError(name)
                    exc.__notes__ = [AttributeValidationNote(
                        f"Structuring class {cls.__qualname__} @ attribute {name}", name, None)]
                    errors.append(exc)
                raise ClassValidationError(f"While structuring {cls.__name__}", errors, cls)
            return generated(value, cls)

        return structure

    return factory


def _describe(exc: BaseException, tp: Any) -> str:
    """cattrs' wording for type faults, the validator's own message for rule faults."""
    if isinstance(exc, (ValueError, TypeError)) and str(exc) and not isinstance(exc, KeyError):
        return str(exc)
    return format_exception(exc, tp)


def _canonical_sort_key(item: Any) -> str:
    return json.dumps(item, sort_keys=True)


def _is_frozenset_type(tp: Any) -> bool:
    return tp is frozenset or typing.get_origin(tp) is frozenset


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for primitive, hook in ((int, _structure_int), (float, _structure_float),
                            (str, _structure_str), (bool, _structure_bool)):
        conv.register_structure_hook(primitive, hook)
    conv.register_structure_hook(FrozenDict, _structure_frozen_dict)
    conv.register_unstructure_hook(FrozenDict, thaw_json)

    def structure_enum(value: Any, cls: type[enum.Enum]) -> enum.Enum:
        if not isinstance(value, str):
            raise _type_error(f"a {cls.__name__} name", value)
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a {cls.__name__}; allowed: {[m.value for m in cls]}"
            ) from None

    # StrEnum/IntEnum come before str/int in their MRO, so enums reach this hook, not the strict str one.
    for base in (enum.Enum, enum.StrEnum, enum.IntEnum):
        conv.register_structure_hook(base, structure_enum)
    conv.register_unstructure_hook_func(
        lambda t: isinstance(t, type) and issubclass(t, enum.Enum), lambda e: e.value
    )
    conv.register_structure_hook_factory(_is_sequence_type, _sequence_hook(conv))
    conv.register_structure_hook_factory(attrs.has, _all_fields_required(conv))

    def unstructure_frozenset(value: frozenset[Any]) -> list[Any]:
        return sorted((conv.unstructure(v) for v in value), key=_canonical_sort_key)

    conv.register_unstructure_hook_func(_is_frozenset_type, unstructure_frozenset)
    return conv


converter = _make_converter()
"""The project's one converter; use it (or the functions below) for every contract."""


def _kind_of(cls: type) -> str:
    if cls.__name__ not in CONTRACT_TYPES or CONTRACT_TYPES[cls.__name__] is not cls:
        raise TypeError(
            f"{cls.__name__} is not a registered contract; known kinds: {sorted(CONTRACT_TYPES)}"
        )
    return cls.__name__


def unstructure(obj: Any) -> Any:
    """The plain JSON data of a contract (no envelope)."""
    return converter.unstructure(obj)


def _errors_as_text(exc: BaseException, root: str) -> tuple[str, str]:
    if isinstance(exc, BaseValidationError):
        messages = cattrs.transform_error(exc, path=root, format_exception=_describe)
        first = messages[0] if messages else str(exc)
        path = first.rsplit(" @ ", 1)[1] if " @ " in first else root
        return "; ".join(messages), path
    return str(exc), root


def _check_tree(data: Any, path: str) -> None:
    """Depth, integer bounds and UTF-8 of every value and key, before any hook sees them (iterative)."""
    stack: list[tuple[Any, str, int]] = [(data, path, 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, (Mapping, list, tuple)):
            if depth >= MAX_DEPTH:
                raise ContractError(f"nesting deeper than {MAX_DEPTH} levels", path=where)
            if isinstance(value, Mapping):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise ContractError(f"object key {key!r} is not a string", path=where)
                    try:
                        _utf8(key)
                    except ValueError as exc:
                        raise ContractError(f"object key: {exc}", path=where) from None
                    stack.append((item, f"{where}.{key}", depth + 1))
            else:
                stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            try:
                _utf8(value)
            except ValueError as exc:
                raise ContractError(str(exc), path=where) from None
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise ContractError(f"integer beyond the bound 2**63-1 ({len(str(abs(value)))} digits)", path=where)


def structure(data: Any, cls: type[T], *, path: str = "$") -> T:
    """Build a contract from its plain JSON data (no envelope); ContractError on any fault."""
    _check_tree(data, path)
    try:
        return converter.structure(data, cls)
    except (BaseValidationError, ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, ContractError):
            raise
        message, where = _errors_as_text(exc, path)
        raise ContractError(f"invalid {cls.__name__} document: {message}", path=where) from exc


def to_dict(obj: Any) -> dict[str, Any]:
    """The versioned envelope ``{"kind", "version", "data"}`` of a contract."""
    return {"kind": _kind_of(type(obj)), "version": SCHEMA_VERSION, "data": unstructure(obj)}


def from_dict(document: Any, cls: type[T]) -> T:
    """Inverse of ``to_dict``: check the envelope, then structure ``data`` strictly."""
    kind = _kind_of(cls)
    if not isinstance(document, Mapping):
        raise ContractError(f"expected a {kind} document (an object), got {type(document).__name__}", path="$")
    keys = set(document)
    if keys != {"kind", "version", "data"}:
        extra, missing = sorted(keys - {"kind", "version", "data"}), sorted({"kind", "version", "data"} - keys)
        raise ContractError(
            f"a document envelope has exactly kind, version, data; missing {missing}, unknown {extra}", path="$"
        )
    if document["kind"] != kind:
        raise ContractError(f"expected a {kind} document, got kind {document['kind']!r}", path="$.kind")
    version = document["version"]
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise ContractError(
            f"document version {version!r} is not supported (this library reads version {SCHEMA_VERSION})",
            path="$.version",
        )
    return structure(document["data"], cls, path="$.data")


def to_json(obj: Any, **kwargs: Any) -> str:
    """Serialize a contract to a JSON document; ``kwargs`` go to ``json.dumps`` (e.g. indent)."""
    kwargs.setdefault("sort_keys", True)
    return json.dumps(to_dict(obj), **kwargs)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        out[key] = value
    return out


def from_json(text: str | bytes, cls: type[T]) -> T:
    """Parse a JSON document produced by ``to_json`` (UTF-8, no duplicate keys, bounded nesting)."""
    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        document = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError as exc:
        raise ContractError(f"not UTF-8 text: {exc}", path="$") from None
    except (ValueError, RecursionError) as exc:
        raise ContractError(f"not valid JSON: {exc}", path="$") from None
    return from_dict(document, cls)


def canonical_json(obj: Any) -> str:
    """The canonical text of a contract: sorted keys, no spaces; the input of every digest."""
    return json.dumps(to_dict(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_digest(obj: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON: a content address."""
    return "sha256:" + hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()


# ---- JSON Schema ----------------------------------------------------------------------------
def _schema_of(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return {"type": "null"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "minimum": -MAX_INT, "maximum": MAX_INT}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is FrozenDict:
        return {"type": "object"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": "string", "enum": [m.value for m in tp]}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema_of(a, defs) for a in args]}
    if origin is frozenset:
        return {"type": "array", "uniqueItems": True, "items": _schema_of(args[0], defs)}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _schema_of(args[0], defs)}
        return {
            "type": "array", "prefixItems": [_schema_of(a, defs) for a in args],
            "minItems": len(args), "maxItems": len(args),
        }
    if isinstance(tp, type) and attrs.has(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # placeholder against recursion
            attrs.resolve_types(tp)
            fields = attrs.fields(tp)
            defs[tp.__name__] = {
                "type": "object",
                "description": (tp.__doc__ or "").strip().splitlines()[0] if tp.__doc__ else "",
                "properties": {f.name: {**_schema_of(f.type, defs), **f.metadata.get(SCHEMA_METADATA, {})}
                               for f in fields},
                "required": [f.name for f in fields if f.init],  # the converter requires every field
                "additionalProperties": False,
            }
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no JSON Schema for type {tp!r}")  # pragma: no cover - guarded by a test


def json_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a contract's document, envelope included."""
    kind = _kind_of(cls)
    defs: dict[str, Any] = {}
    ref = _schema_of(cls, defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": kind,
        "type": "object",
        "properties": {"kind": {"const": kind}, "version": {"const": SCHEMA_VERSION}, "data": ref},
        "required": ["kind", "version", "data"],
        "additionalProperties": False,
        "$defs": defs,
    }
