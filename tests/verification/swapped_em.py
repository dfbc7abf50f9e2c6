"""A third-party EM backend that folds two chunks out of order (issue 35 item 3): ``swapped_em``.

Importing the module registers it. Its runner is the template's, except that every pass hands back chunk 1's and
chunk 2's results swapped: the same rows, the same one-piece log-likelihood within rounding, and the same wrong bits
on any worker count -- only a comparison bit for bit with the fixed fold order of one process tells.
Threads of this process (a world of one), so the harness, the CLI and a fit run it without a certificate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from examples.em_backend_template import TemplateRunner, planned_workers
from mixle_parallel import EncodedDataOptions, handle_from_runner, register_encoded_data_backend

NAME = "swapped_em"


class SwappedRunner(TemplateRunner):
    """The template's runner, with chunk 1's and chunk 2's results handed back in each other's place."""

    name = NAME

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        """The template's results, chunks 1 and 2 swapped when chunks 0-2 were asked for."""
        results = super().map_chunks(fn, payload, chunk_ids)
        ids = sorted(range(len(self._chunks)) if chunk_ids is None else set(chunk_ids))
        if ids[:3] == [0, 1, 2] and results[1] is not None and results[2] is not None:
            results[1], results[2] = results[2], results[1]  # (a + c) + b: not the bits of (a + b) + c
        return results


def swapped_em(data: Any, *, num_workers: int | None = None, **options: Any) -> Any:
    """What ``encoded_data(data, backend="swapped_em", ...)`` calls."""
    runner = SwappedRunner(planned_workers(EncodedDataOptions(num_workers=num_workers)))
    try:
        return handle_from_runner(runner, data, **options)
    except BaseException:
        runner.close()
        raise


register_encoded_data_backend(NAME, swapped_em, options={"num_workers"}, worker_processes=False,
                              planned_workers=planned_workers, override=True)
