"""Declared memory sizes for the planner: a model's resident bytes and an estimator's statistic bytes.

A size is known only from what an object declares, never from walking its ``__dict__``:
``mixle_memory_nbytes()`` (the :class:`MemorySized` protocol), arrays and tensors (their element
bytes), a torch module's parameters and buffers, plain data (tuples, lists, dicts, numbers, strings),
or a model tree through the decomposition contract (``decomposition()``, a registered decomposition,
or ``params()``; see ``model_decomposition``). Anything else raises
:class:`UnknownMemoryFootprintError` naming where in the tree it sits and how to declare it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ....contracts.errors import UnknownMemoryFootprintError
from ..compat.mixle_decomposition import MIXLE_FAMILIES
from ..compat.mixle_interop import MixleModel, as_estimator
from .model_decomposition import decomposition_of, has_declared_decomposition

__all__ = ["UnknownMemoryFootprintError", "estimate_estimator_stat_nbytes", "estimate_model_nbytes"]

_FIX = ("declare it: give the class mixle_memory_nbytes() -> int, a decomposition() (or "
        "register_decomposition(cls, ...)), or params() returning its arrays")


def _declared(value: Any, path: str) -> int | None:
    """Bytes an object states itself (MemorySized, array, tensor, torch module), else None."""
    method = getattr(value, "mixle_memory_nbytes", None)
    if callable(method):
        try:
            result = method()
        except Exception as exc:  # noqa: BLE001 - reported with the path
            raise UnknownMemoryFootprintError(f"{path}: mixle_memory_nbytes() failed: {exc!r}") from exc
        if isinstance(result, (bool, np.bool_)) or not isinstance(result, (int, np.integer)) or result < 0:
            raise UnknownMemoryFootprintError(f"{path}: mixle_memory_nbytes() returned {result!r}, not an int >= 0")
        return int(result)
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return sum(_plain(v, f"{path}[{i}]") for i, v in enumerate(value.ravel()))
        return int(value.nbytes)
    numel, element_size = getattr(value, "numel", None), getattr(value, "element_size", None)
    if callable(numel) and callable(element_size):  # a torch tensor, without importing torch
        return int(numel()) * int(element_size())
    parameters, buffers = getattr(value, "parameters", None), getattr(value, "buffers", None)
    if callable(parameters) and callable(buffers):  # a torch module: its parameters and buffers, shared ones once
        tensors = {id(t): t for t in (*parameters(), *buffers())}
        return sum(int(t.numel()) * int(t.element_size()) for t in tensors.values())
    return None


def _plain(value: Any, path: str) -> int:
    """Bytes of plain data: declared objects, numbers (8, or a numpy scalar's itemsize), text, containers."""
    if value is None:
        return 0
    declared = _declared(value, path)
    if declared is not None:
        return declared
    if isinstance(value, np.generic):
        return int(value.itemsize)
    if isinstance(value, (bool, int, float)):
        return 8
    if isinstance(value, complex):
        return 16
    if isinstance(value, (str, bytes, bytearray)):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_plain(k, f"{path}.key") + _plain(v, f"{path}[{k!r}]") for k, v in value.items())
    if isinstance(value, (tuple, list, set, frozenset)):
        return sum(_plain(v, f"{path}[{i}]") for i, v in enumerate(value))
    raise UnknownMemoryFootprintError(
        f"{path} ({type(value).__module__}.{type(value).__qualname__}) declares no size; {_FIX}")


def _unlisted_mixle_family(node: Any) -> bool:
    """A mixle object (class under the ``mixle`` package) none of whose classes the family table lists."""
    mro = type(node).__mro__
    return (mro[0].__module__.split(".")[0] == "mixle"
            and not any(c.__module__.split(".")[0] == "mixle" and c.__name__ in MIXLE_FAMILIES for c in mro))


def _tree(node: Any, path: str, seen: set[int]) -> int:
    """Bytes of a model subtree: declared sizes first, else the decomposition (shared subtrees once)."""
    if id(node) in seen:
        return 0
    seen.add(id(node))
    declared = _declared(node, path)
    if declared is not None:
        return declared
    if isinstance(node, MixleModel):  # our wrapper: size the mixle distribution it holds
        return _tree(node.dist, path, seen)
    if not has_declared_decomposition(node):
        if isinstance(node, (Mapping, tuple, list, np.generic, int, float, str, bytes)):
            return _plain(node, path)
        raise UnknownMemoryFootprintError(
            f"{path} ({type(node).__module__}.{type(node).__qualname__}) declares no size; {_FIX}")
    if _unlisted_mixle_family(node):  # its translated decomposition would carry no parameters: 0 bytes, unknowingly
        raise UnknownMemoryFootprintError(
            f"{path} (mixle's {type(node).__name__}) is not in the declared mixle family table, so its parameters "
            f"are unknown; register_mixle_family({type(node).__name__!r}, children=..., params=...) or {_FIX}")
    try:
        dc = decomposition_of(node)
    except TypeError as exc:  # e.g. a mixle model's own decomposition(), which declares no parameters
        raise UnknownMemoryFootprintError(f"{path}: {exc}; its sizes are not declared to us; {_FIX}") from exc
    total = _plain(dc.params, f"{path}.params")
    children = [(dc.role(i), u) for i, u in enumerate(dc.units)] + [(f"owned_{i}", o) for i, o in enumerate(dc.owned)]
    for role, child in children:
        total += _tree(child, f"{path}/{role}", seen)
    return total


def estimate_model_nbytes(model: Any) -> int:
    """The model's resident bytes from what it declares (0 for None); UnknownMemoryFootprintError otherwise."""
    if model is None:
        return 0
    return _tree(model, type(model).__name__, set())


def estimate_estimator_stat_nbytes(estimator: Any) -> int:
    """Bytes of the estimator's zero sufficient statistic (a fresh accumulator's ``value()``), 0 for None."""
    if estimator is None:
        return 0
    try:
        value = as_estimator(estimator).accumulator_factory().make().value()
    except Exception as exc:  # noqa: BLE001 - any failure means the size is unknown
        raise UnknownMemoryFootprintError(
            f"could not build a zero accumulator for {type(estimator).__name__}: {exc!r}") from exc
    return _plain(value, f"{type(estimator).__name__}.accumulator")
