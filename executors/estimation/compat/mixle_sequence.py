"""mixle 0.8.2's sequence interface on every handle: the ``pysp_*`` methods mixle's ``optimize`` calls.

:class:`MixleSequenceMethods` is a base of ``ChunkedEncodedData``: mixle's ``optimize(..., enc_data=handle)``
and its streaming EM call these names on the handle, which turn them into the handle's passes (mixle objects adapted in,
mixle distributions out). Nothing here runs a pass itself: it calls the handle's E-step and chunk maps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..em_pass.chunks import (
    EStepResult,
    chunk_initialize,
    combine_in_chunk_order,
    ordered_sum,
    seed_from,
)
from .mixle_interop import adapt_mixle_objects, unwrap_mixle, wrap_mixle_model

__all__ = ["MixleSequenceMethods"]


class _SequenceHost(Protocol):
    """What the sequence methods use of the handle they are part of."""

    @property
    def num_rows(self) -> int: ...

    def estep(self, estimator: Any, model: Any) -> EStepResult: ...

    def estep_entries(self, estimator: Any, model: Any, raw: Any = (), *, commit: bool = False,
                      retain: str = "") -> list[Any]: ...

    def _bound(self, estimator: Any, model: Any) -> tuple[Any, Any]: ...

    def _map(self, fn: Callable[[Any, Any], Any], payload: Any, estimator: Any = None,
             model: Any = None) -> list[Any]: ...

    def _fold_entries(self, estimator: Any, entries: list[Any]) -> Any: ...

    def _log_densities(self, estimate: Any) -> list[Any]: ...


class MixleSequenceMethods:
    """mixle's ``pysp_seq_*`` / ``pysp_stream_accumulate`` / ``num_records`` over a handle's passes (module doc)."""

    def pysp_seq_estimate(self: _SequenceHost, estimator: Any, prev_estimate: Any) -> Any:
        """One E/M update from ``prev_estimate`` (the new model); mixle objects in, a mixle distribution out."""
        estimator, prev_estimate, _ = adapt_mixle_objects(estimator, prev_estimate, None)
        return unwrap_mixle(self.estep(estimator, prev_estimate).model)

    def pysp_seq_log_density_sum(self: _SequenceHost, estimate: Any) -> tuple[float, float]:
        """Rows and total log-likelihood of ``estimate`` (ours or a mixle distribution) over the data."""
        results = self._log_densities(self._bound(None, wrap_mixle_model(estimate))[1])
        return ordered_sum([r[0] for r in results]), ordered_sum([r[1] for r in results])

    def pysp_seq_initialize(self: _SequenceHost, estimator: Any, rng: Any, p: float) -> Any:
        """A random start: rows kept with probability ``p``; draws depend on (seed, chunk id) only."""
        if not (isinstance(p, (int, float)) and 0.0 < float(p) <= 1.0):
            raise ValueError(f"init_p must be in (0, 1], got {p!r}")
        estimator, _, _ = adapt_mixle_objects(estimator, None, None)
        seed = seed_from(rng)
        results = self._map(chunk_initialize, (estimator, seed, float(p)), estimator)
        nobs = ordered_sum([r[0] for r in results])
        if nobs == 0.0 and self.num_rows > 0:
            # Nothing was drawn (tiny data, small p): start from every row instead.
            results = self._map(chunk_initialize, (estimator, seed, 1.0), estimator)
            nobs = ordered_sum([r[0] for r in results])
        stats = combine_in_chunk_order(estimator, [r[1] for r in results])
        return unwrap_mixle(estimator.estimate(nobs, stats))

    def pysp_stream_accumulate(self: _SequenceHost, estimator: Any, model: Any) -> tuple[float, Any]:
        """Rows and the combined statistics under ``model`` (mixle's streaming-EM fold), no M-step."""
        estimator, model, _ = adapt_mixle_objects(estimator, model, None)
        total = self._fold_entries(estimator, self.estep_entries(estimator, model))
        return total.count, total.stats

    @property
    def num_records(self: _SequenceHost) -> int:
        """Rows of the data (mixle's name for ``num_rows``)."""
        return self.num_rows
