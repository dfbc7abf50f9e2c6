"""Whether a pass's workers send every chunk's own result with their group sums: a pure decision per pass.

A folded group commits to a digest per chunk; after the draw, the groups holding an audited chunk are opened:
their workers reveal the chunks' own results (``fold_binding.reveal_chunks``). A reveal is a round of its own after
the pass: an engine job where the worker keeps nothing between jobs (Spark, the task runners), a round trip to the
worker that folded elsewhere (mp, dask and Ray actors), so an audited pass costs that round more. When the own
results are small, every pass (audited or not: the tasks stay the same) brings back every chunk's own result
beside its group's sum and digests instead: the draw still comes after it, the opened groups are checked against
their digests and sums exactly as revealed ones, and no reveal round runs. The own results ship sealed
(``combine_order.SealedResult``: the bytes their digests are of), so the driver unpickles only the opened groups'.
SPMD ranks (mpi, torchrun) keep their reveal step: it is one of the pass's numbered collectives, the same on
every rank, and own results would widen every all-gather.
"""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["OWN_RESULTS_MAX_BYTES", "empty_statistic_bytes", "ship_own_results"]

OWN_RESULTS_MAX_BYTES = 4 << 20
"""The most bytes a pass's own results may add to what comes back (estimated from the estimator's statistics)."""


def empty_statistic_bytes(estimator: Any) -> int | None:
    """The pickled size of ``estimator``'s statistics before any row (a chunk's own result is about as large for
    the fixed-size statistics of mixture models), known before the first pass so every pass gets the same tasks;
    None when the estimator cannot make an empty accumulator."""
    try:
        value = estimator.accumulator_factory().make().value()
        return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - an estimator without one: the reveal round, as before
        return None


def ship_own_results(spmd: bool, result_bytes: int | None, num_chunks: int) -> bool:
    """Send every chunk's own result with the pass: outside an SPMD program, where the own results of ``num_chunks``
    chunks of about ``result_bytes`` each (``empty_statistic_bytes``) stay within the bound."""
    return not spmd and result_bytes is not None and result_bytes * num_chunks <= OWN_RESULTS_MAX_BYTES
