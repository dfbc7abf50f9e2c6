"""The ``ray`` backend over a Ray module that offers tasks and the object store but no cluster view.

mixle 0.8.2's ``RayEncodedData`` needs only ``is_initialized``, ``init``, ``put`` and ``shutdown`` to
be built, and ``remote`` and ``get`` for a pass. A Ray module (or stand-in) without
``cluster_resources`` -- which the actor runner needs to size its actors -- gets :class:`RayTaskRunner`:
every encoded chunk is ``put`` once, each pass runs one remote task per chunk reference and gathers
the results in chunk order (the same bits as every other backend).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..sources.recipes import materialize

__all__ = ["RayTaskRunner", "has_cluster_view"]


def has_cluster_view(ray: Any) -> bool:
    """Whether ``ray`` can report its resources (the actor runner sizes its actors from them)."""
    return callable(getattr(ray, "cluster_resources", None))


def _run(fn: Callable[[Any, Any], Any], chunk: Any, payload: Any) -> Any:
    return fn(materialize(chunk), payload)  # a recipe (files) is read by the task


class RayTaskRunner:
    """Chunk runner: chunks in the object store, one remote task per chunk and pass."""

    name = "ray"
    supports_worker_placement = False

    def __init__(self, ray: Any, *, num_workers: int | None = None, address: str | None = None,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        missing = [m for m in ("is_initialized", "init", "put", "shutdown") if not callable(getattr(ray, m, None))]
        if missing:
            raise TypeError(f"the ray module {ray!r} has no {', '.join(missing)}(): install ray (the [ray] extra)")
        if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int)
                                        or num_workers < 1):
            raise ValueError(f"num_workers must be an int >= 1 or None, got {num_workers!r}")
        self.ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False)
            kwargs.update(init_kwargs or {})
            if address is not None:
                kwargs["address"] = address
            ray.init(**kwargs)
        self.num_workers = 1 if num_workers is None else int(num_workers)
        self._refs: list[Any] = []

    def scatter(self, chunks: Sequence[Any]) -> None:
        """``put`` every chunk once (the driver owns the objects)."""
        self._refs = [self.ray.put(c) for c in chunks]

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        """``fn(chunk, payload)`` as one remote task per chunk id, results in chunk-id order."""
        ids = range(len(self._refs)) if chunk_ids is None else sorted(chunk_ids)
        if not callable(getattr(self.ray, "remote", None)) or not callable(getattr(self.ray, "get", None)):
            raise TypeError(f"the ray module {self.ray!r} has no remote()/get(): it cannot run a pass")
        task = self.ray.remote(_run)
        return list(self.ray.get([task.remote(fn, self._refs[i], payload) for i in ids]))

    def close(self) -> None:
        """Drop the chunk objects; shut Ray down when this runner started it (once)."""
        self._refs = []
        if self._owns_ray and self.ray.is_initialized():
            self.ray.shutdown()
        self._owns_ray = False
