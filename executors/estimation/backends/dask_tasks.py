"""The ``dask`` backend over a client that only submits and gathers (mixle 0.8.2 accepts any such client).

A ``distributed.Client`` gets :class:`~mixle_parallel.executors.estimation.backends.dask.DaskRunner`
(chunks resident in pinned actors). Any other object with ``submit``, ``gather`` and
``scheduler_info`` -- a synchronous stand-in, a client proxy -- gets :class:`DaskTaskRunner`: the
encoded chunks stay on the driver and each pass submits one task per chunk, gathered in chunk order,
so the statistics are the same bits as every other backend (the chunks travel with every pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..sources.recipes import materialize

__all__ = ["DaskTaskRunner", "is_task_only_client", "scheduler_workers"]


def scheduler_workers(client: Any) -> list[str]:
    """The worker names ``client.scheduler_info()`` lists (every one: ``n_workers=-1`` where it is taken)."""
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # clients before dask 2025, and stand-ins, take no n_workers
        info = client.scheduler_info()
    if not isinstance(info, dict) or not isinstance(info.get("workers", {}), dict):
        raise TypeError(f"{type(client).__name__}.scheduler_info() must return a dict with a 'workers' dict, "
                        f"got {type(info).__name__}")
    return sorted(str(w) for w in info.get("workers", {}))


def is_task_only_client(client: Any, distributed: Any) -> bool:
    """Whether ``client`` is not a ``distributed.Client`` but can submit and gather (the task runner's case)."""
    if client is None or isinstance(client, distributed.Client):
        return False
    missing = [m for m in ("submit", "gather", "scheduler_info") if not callable(getattr(client, m, None))]
    if missing:
        raise TypeError(f"the dask client {type(client).__name__} has no {', '.join(missing)}(): pass a "
                        "distributed.Client (or an object with submit, gather and scheduler_info)")
    return True


def _run(fn: Callable[[Any, Any], Any], chunk: Any, payload: Any) -> Any:
    return fn(materialize(chunk), payload)  # a recipe (files) is read by the task


class DaskTaskRunner:
    """Chunk runner submitting ``fn(chunk, payload)`` per chunk to a submit/gather client."""

    name = "dask"
    supports_worker_placement = False

    def __init__(self, client: Any, *, num_workers: int | None = None) -> None:
        workers = scheduler_workers(client)
        if not workers:
            raise ValueError(f"the dask client {type(client).__name__} lists no workers in scheduler_info()")
        if num_workers is not None:
            if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
                raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
            if num_workers > len(workers):
                raise ValueError(f"num_workers={num_workers} but the dask client has {len(workers)} worker(s); "
                                 "pass num_workers=None to use them all, or start more workers")
        self.client = client
        self.num_workers = len(workers) if num_workers is None else int(num_workers)
        self._chunks: list[Any] = []

    def scatter(self, chunks: Sequence[Any]) -> None:
        """Keep the encoded chunks on the driver (each pass sends the ones it needs)."""
        self._chunks = list(chunks)

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        """``fn(chunk, payload)`` per chunk id as one task each, results in chunk-id order."""
        ids = range(len(self._chunks)) if chunk_ids is None else sorted(chunk_ids)
        futures = [self.client.submit(_run, fn, self._chunks[i], payload, pure=False) for i in ids]
        try:
            return list(self.client.gather(futures))
        except BaseException:
            cancel = getattr(self.client, "cancel", None)
            if callable(cancel):
                cancel(futures)
            raise

    def close(self) -> None:
        """Drop the chunks (the client is the caller's)."""
        self._chunks = []
