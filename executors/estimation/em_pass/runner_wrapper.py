"""A runner that wraps another (metering, mixle's payload tap) shows exactly the wrapped runner's capabilities.

The pass reads a runner's optional capabilities with ``isinstance`` against ``runtime_checkable`` Protocols
(``runner_protocols``). From Python 3.12 those checks look members up with ``inspect.getattr_static``, which
never reaches a wrapper's ``__getattr__``: a wrapper forwarding through ``__getattr__`` alone would lose every
capability of what it wraps on 3.12 (the audit's placement silently off, a Spark DataFrame refused) while 3.11
sees them. :class:`ForwardingRunner` gives each instance a class that names, as forwarding properties, exactly
the capability members its wrapped runner has, so both versions see the same capabilities.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["CAPABILITY_MEMBERS", "ForwardingRunner"]

CAPABILITY_MEMBERS = (
    "name", "num_workers", "supports_worker_placement", "scatter", "map_chunks", "close", "compute_on",
    "worker_ids", "chunk_owners", "run_on_workers", "assign_chunks", "transport_bytes", "transport_messages",
    "live_workers", "worker_pids", "rank", "all_gather", "root", "is_root", "client", "place_partitions", "run_job",
    "read_held", "open_rows", "place_held", "timeout", "wait_for_tasks",
)
"""Every member a runner Protocol of ``runner_protocols`` (or ``chunks.ChunkRunner``) names."""

_CLASSES: dict[tuple[type, tuple[str, ...]], type] = {}
_CLASSES_LOCK = threading.Lock()


def _forward(name: str) -> property:
    return property(lambda self: getattr(self.inner, name), doc=f"The wrapped runner's ``{name}``.")


class ForwardingRunner:
    """Base of a runner wrapper: ``inner`` is the wrapped runner; any member the subclass does not define is the
    wrapped runner's (``__getattr__``), and the capability members it has are also on the instance's class."""

    inner: Any

    def __new__(cls, inner: Any, *args: Any, **kwargs: Any) -> Any:
        present = tuple(n for n in CAPABILITY_MEMBERS if not hasattr(cls, n) and hasattr(inner, n))
        key = (cls, present)
        with _CLASSES_LOCK:
            shown = _CLASSES.get(key)
            if shown is None:
                shown = type(cls.__name__, (cls,), {n: _forward(n) for n in present}
                             | {"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                "__doc__": cls.__doc__})
                _CLASSES[key] = shown
        return super().__new__(shown)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
