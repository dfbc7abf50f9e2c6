"""mixle's ``AuditedMPEncodedData`` names its audited chunks in the pass (drawn from the caller's ``rng``, mixle's
API); the secret-sample reference audit runs on the same passes, so a backend cannot spare exactly them.

The cheat below sits under the handle's runner: every folded group that holds none of the chunks the pass
names comes back with honest chunk digests and its statistics scaled. Before this change mixle's audit (peer
replays and the reference of the named chunks) passed it and the fit used the scaled sums; now the secret
sample's groups are opened and re-folded in the driver, and the cheat is a backend defect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from mixle_parallel import GaussianEstimator, MixtureEstimator
from mixle_parallel.executors.estimation.em_pass.combine_order import GroupFold, GroupStats, group_of
from mixle_parallel.sdc_audit import AuditedMPEncodedData
from mixle_parallel.verification.sdc import BackendDefectError
from tests.estimation.audit.fold_cheats import scaled

EST = MixtureEstimator([GaussianEstimator()] * 2)


class SparesNamedChunks:
    """A runner wrapper: folded groups holding no chunk the pass's ``GroupFold`` names get scaled statistics."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.scaled = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _tamper(self, fn: Any, ids: Sequence[int], values: list[Any]) -> list[Any]:
        fold = fn
        while not isinstance(fold, GroupFold) and hasattr(fold, "fn"):
            fold = fold.fn
        if not isinstance(fold, GroupFold):
            return values
        out = []
        for c, entry in zip(ids, values):
            metered = type(entry).__name__ == "Metered"
            value = entry.value if metered else entry
            a, b = group_of(fold.num_chunks, int(c))
            if isinstance(value, GroupStats) and not fold.raw & set(range(a, b)):
                value = value._replace(stats=scaled(value.stats, 1.5))
                self.scaled += 1
                entry = entry._replace(value=value) if metered else value
            out.append(entry)
        return out

    def map_chunks(self, fn: Any, payload: Any, chunk_ids: Sequence[int] | None = None) -> list[Any]:
        ids = range(self.inner.num_chunks) if chunk_ids is None else sorted(chunk_ids)
        return self._tamper(fn, list(ids), self.inner.map_chunks(fn, payload, chunk_ids))

    def run_on_workers(self, tasks: dict[int, Any]) -> dict[int, list[Any]]:
        out = self.inner.run_on_workers(tasks)
        return {w: self._tamper(tasks[w].fn, tasks[w].chunk_ids, v) for w, v in out.items()}


def test_a_backend_that_spares_exactly_mixles_named_chunks_is_caught_by_the_secret_sample():
    rng = np.random.default_rng(9)
    data = np.concatenate([rng.normal(-2, 1.0, 1200), rng.normal(3, 1.0, 1200)])
    with AuditedMPEncodedData(data, EST, num_workers=2, num_chunks=48, audit_rate=0.25, audit_policy="raise",
                              rng=np.random.RandomState(3)) as h:
        model = h.pysp_seq_initialize(EST, np.random.RandomState(0), 0.5)
        cheat = SparesNamedChunks(h._metered.inner)
        h._metered.inner = cheat
        with pytest.raises(BackendDefectError) as caught:
            for _ in range(4):
                model = h.pysp_seq_estimate(EST, model)
        assert cheat.scaled > 0
        bad = [r for r in caught.value.records if not r.matched]
        assert [(r.unit.split(":")[0], r.cause) for r in bad] == [("group", "backend_defect")]
        assert len(h.last_round_audited_shards) <= 12  # mixle's draw (round(0.25 x 48)) is still what it reports
