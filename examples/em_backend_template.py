"""A third-party EM backend for mixle-parallel, end to end: copy this file and replace the transport.

An EM backend is three things, all below:

1. a **chunk runner** (``TemplateRunner``): ``name``, ``num_workers``, ``scatter(chunks)`` once,
   ``map_chunks(fn, payload, chunk_ids=None)`` per pass (results ordered by chunk id), ``close()``.
   Here the workers are threads of this process; yours would be processes, hosts or actors, each
   keeping its block of encoded chunks resident between passes;
2. a **factory** (``template_em``): what ``encoded_data(data, backend="template_em", ...)`` calls
   with every option it honours; it builds the runner from its own options and hands the rest
   (the estimator, the chunking...) to ``handle_from_runner``, which encodes the chunks, fixes the
   combine order (the same bits as every other backend) and adds the SDC audit and the ledger;
3. a **registration** that declares what the backend honours (any other option is refused before
   anything starts), whether its workers are processes, and the workers it will run: the admission
   gate takes its world from that (worker processes on more than one worker need a certificate).

Run it: ``python examples/em_backend_template.py`` fits a mixture on this backend and checks the bits
against one process. How to verify, certify and run the conformance suite on it (with JUnit reports for CI),
and what each declaration means, is the one guide: docs/estimation_backends.md, "Writing a backend".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mixle_parallel import EncodedDataOptions, apply_chunk_fn, handle_from_runner, register_encoded_data_backend

NAME = "template_em"
DEFAULT_WORKERS = 2


class TemplateRunner:
    """Each worker keeps a contiguous block of chunk ids; a pass runs every worker's block at once."""

    name = NAME

    def __init__(self, num_workers: int, *, timeout: float | None = 60.0) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"{NAME} num_workers must be an int >= 1, got {num_workers!r}")
        self.num_workers = num_workers
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix=NAME)
        self._chunks: list[Any] = []
        self._blocks: list[list[int]] = []

    def scatter(self, chunks: Sequence[Any]) -> None:
        """Place the encoded chunks once: worker ``w`` keeps chunk ids ``blocks[w]`` (list index == chunk id)."""
        n = len(chunks)
        edges = [w * n // self.num_workers for w in range(self.num_workers + 1)]
        self._blocks = [list(range(edges[w], edges[w + 1])) for w in range(self.num_workers)]
        self._chunks = list(chunks)  # a real transport sends worker w its chunks[edges[w]:edges[w + 1]] here

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        """``fn(chunk, payload)`` where each chunk lives, results ordered by chunk id."""
        wanted = set(range(len(self._chunks))) if chunk_ids is None else set(chunk_ids)

        def on_worker(ids: list[int]) -> list[Any]:  # runs where the block lives
            # apply_chunk_fn lets a pass fold whole combine groups on the worker (fewer, smaller replies)
            return apply_chunk_fn(fn, payload, ids, self._chunks.__getitem__)

        work = {w: [i for i in block if i in wanted] for w, block in enumerate(self._blocks)}
        futures = {w: self._pool.submit(on_worker, ids) for w, ids in work.items() if ids}
        results: dict[int, Any] = {}
        for w, future in futures.items():
            results.update(zip(work[w], future.result(timeout=self.timeout)))
        return [results[i] for i in sorted(wanted)]

    def close(self) -> None:
        """Stop the workers and drop the chunks (the handle calls this once)."""
        self._pool.shutdown(wait=True)
        self._chunks, self._blocks = [], []


def planned_workers(options: EncodedDataOptions) -> int:
    """The workers ``template_em`` runs for these options, known before any starts (the admission gate's world)."""
    return DEFAULT_WORKERS if options.num_workers is None else options.num_workers


def template_em(data: Any, *, num_workers: int | None = None, timeout: float | None = 60.0, **options: Any) -> Any:
    """What ``encoded_data(data, backend="template_em", ...)`` calls: the runner takes ``num_workers`` and
    ``timeout``; ``options`` (the estimator, the chunking, ...) are the handle's."""
    runner = TemplateRunner(planned_workers(EncodedDataOptions(num_workers=num_workers)), timeout=timeout)
    try:
        return handle_from_runner(runner, data, **options)
    except BaseException:
        runner.close()
        raise


register_encoded_data_backend(
    NAME, template_em,
    options={"num_workers", "timeout"},  # besides every handle's own: estimator, model, encoder, chunking, precision
    worker_processes=False,  # threads of this process: a world of one, admitted without a certificate
    planned_workers=planned_workers,
)

if __name__ == "__main__":
    import numpy as np

    from mixle_parallel import GaussianEstimator, MixtureEstimator, fit

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2.0, 1.0, 3000), rng.normal(3.0, 0.5, 3000)])
    estimator = MixtureEstimator([GaussianEstimator()] * 2)
    ours = fit(x, estimator, max_its=20, seed=1, chunk_size=500, backend=NAME, num_workers=3)
    one = fit(x, estimator, max_its=20, seed=1, chunk_size=500)  # one process, the local backend
    assert ours.history == one.history, "a backend must give the bits of one process"
    print(f"{NAME}: {ours.iterations} iterations, log-likelihood {ours.log_likelihood:.3f} "
          f"({ours.stop_reason}), the same bits as one process")
