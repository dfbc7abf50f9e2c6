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
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.v import format_exception

from .bounded_json import CONTRACT_LIMITS, MAX_INT, DocumentLimits, check_shape, parse_json
from .canonical_json import hashed_json_bytes
from .errors import ContractError
from .frozen_mapping import FrozenDict, thaw_json

T = TypeVar("T")

SCHEMA_VERSION = 1
"""Version written in every envelope; documents of another version are refused."""

SCHEMA_METADATA = "json_schema"

OPTIONAL_KEY = "optional_key"
"""Field metadata flag: a field added after documents were stored; absent means its default, and a default value
is left out of the document (so the canonical JSON, and every content digest, of older documents is unchanged)."""
"""attrs field metadata key: JSON Schema keywords (bounds, patterns) the field's validator enforces."""

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
            items = []
            for i, item in enumerate(value):
                item_type = item_types[0] if homogeneous else item_types[i]
                try:
                    items.append(converter.structure(item, item_type))
                except Exception as exc:  # noqa: BLE001 - the first bad item stops structuring (untrusted input)
                    exc.__notes__ = [*getattr(exc, "__notes__", []),
                                      IterableValidationNote(f"Structuring item @ index {i}", i, item_type)]
                    raise cattrs.IterableValidationError(f"while structuring {tp!r}", [exc], tp) from None
            return frozenset(items) if origin is frozenset else tuple(items)

        return structure

    return factory


def _all_fields_required(converter: cattrs.Converter):  # noqa: ANN202 - hook factory
    """Documents spell out every field, defaults included: a missing key is an error, not a default."""

    def factory(cls: type) -> Any:
        attrs.resolve_types(cls)
        generated: Callable[[Any, Any], Any] = make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True)
        names = [f.name for f in attrs.fields(cls) if f.init and not f.metadata.get(OPTIONAL_KEY)]
        max_items = {f.name: f.metadata[SCHEMA_METADATA]["maxItems"] for f in attrs.fields(cls)
                     if "maxItems" in f.metadata.get(SCHEMA_METADATA, {})}

        def fault(name: str, exc: Exception) -> ClassValidationError:
            exc.__notes__ = [AttributeValidationNote(f"Structuring class {cls.__qualname__} @ attribute {name}",
                                                     name, None)]
            return ClassValidationError(f"While structuring {cls.__name__}", [exc], cls)

        def structure(value: Any, _: Any) -> Any:
            if not isinstance(value, Mapping):
                raise _type_error(f"a {cls.__name__} object", value)
            missing = [n for n in names if n not in value]
            if missing:
                raise fault(missing[0], KeyError(missing[0]))
            for name, limit in max_items.items():  # before any item is structured (untrusted input)
                items = value[name]
                if isinstance(items, list) and len(items) > limit:
                    raise fault(name, ValueError(f"{cls.__name__}.{name} holds {len(items)} items, more than the "
                                                 f"limit of {limit}; refused before structuring any"))
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
    def unstructure_optional_keys(cls: Any) -> Any:
        overrides: dict[str, Any] = {f.name: override(omit_if_default=True) for f in attrs.fields(cls)
                                     if f.metadata.get(OPTIONAL_KEY)}
        return make_dict_unstructure_fn(cls, conv, **overrides)

    conv.register_unstructure_hook_factory(_has_optional_keys, unstructure_optional_keys)
    return conv


def _has_optional_keys(cls: Any) -> bool:
    """An attrs class with a field added after documents were stored (``OPTIONAL_KEY``)."""
    return isinstance(cls, type) and attrs.has(cls) and any(f.metadata.get(OPTIONAL_KEY) for f in attrs.fields(cls))


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


def structure(data: Any, cls: type[T], *, path: str = "$", limits: DocumentLimits | None = CONTRACT_LIMITS) -> T:
    """Build a contract from its plain JSON data (no envelope); ContractError on the first fault.

    The shape (depth, item count, integer bounds, UTF-8) is checked against ``limits`` before any hook runs
    (``None``: the caller already checked it, e.g. ``parse_json``).
    """
    if limits is not None:
        check_shape(data, limits, path=path)
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


def from_dict(document: Any, cls: type[T], *, limits: DocumentLimits | None = CONTRACT_LIMITS) -> T:
    """Inverse of ``to_dict``: check the envelope, then the shape against ``limits``, then structure ``data``."""
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
    return structure(document["data"], cls, path="$.data", limits=limits)


def to_json(obj: Any, **kwargs: Any) -> str:
    """Serialize a contract to a JSON document; ``kwargs`` go to ``json.dumps`` (e.g. indent)."""
    kwargs.setdefault("sort_keys", True)
    return json.dumps(to_dict(obj), **kwargs)


def from_json(text: str | bytes, cls: type[T], *, limits: DocumentLimits = CONTRACT_LIMITS) -> T:
    """Parse a JSON document produced by ``to_json``: size, strict JSON and shape under ``limits`` first
    (``bounded_json.parse_json``), then the envelope and the contract; ``ContractError`` for any input, of any type."""
    return from_dict(parse_json(text, limits), cls, limits=None)  # parse_json checked the shape


def canonical_json(obj: Any) -> str:
    """The canonical text of a contract (``canonical_json.hashed_json_bytes``): the input of every content id."""
    return hashed_json_bytes(to_dict(obj)).decode("utf-8")


def content_digest(obj: Any) -> str:
    """``sha256:<hex>`` of the canonical JSON: a content address."""
    return "sha256:" + hashlib.sha256(hashed_json_bytes(to_dict(obj))).hexdigest()


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
                # the converter requires every field but the ones added later (OPTIONAL_KEY)
                "required": [f.name for f in fields if f.init and not f.metadata.get(OPTIONAL_KEY)],
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
