"""Health receipts on real gloo ranks: a loss spike, a slow rank named, a hung and a frozen rank found in
bounded time (the heartbeat through the process group's store), plus the pure monitor's rules."""

from __future__ import annotations

import json
import math
import pathlib
import time

import pytest

from mixle_parallel.verification.harness.mesh import MeshError, run_world
from mixle_parallel.verification.health import (
    ModelFlopConfig,
    RollingBaseline,
    TrainingHealthMonitor,
    theoretical_flops_per_iter,
)
from tests.torch import _health_scenarios as sc


def test_spike_and_straggler_on_two_ranks() -> None:
    ranks = run_world(sc.spike_and_straggler, 2, timeout=600, backend="gloo", group_timeout_s=300)
    for steps in ranks:
        by_step = {s["step"]: s for s in steps}
        assert "loss_spike" in by_step[sc.SPIKE_STEP]["kinds"]
        assert "grad_norm_spike" not in by_step[sc.SPIKE_STEP]["kinds"]  # only the value was spiked
        assert [s["step"] for s in steps if "loss_spike" in s["kinds"]] == [sc.SPIKE_STEP]
        assert by_step[sc.ONE_SLOW_STEP]["straggler"] is None  # one slow step is noise (issue 35)
        assert by_step[sc.ONE_SLOW_STEP]["rank_step_s"][1] >= sc.SLOW_S
        flagged = [by_step[s] for s in sc.SLOW_STEPS if by_step[s]["straggler"] is not None]
        assert len(flagged) == 1 and flagged[0]["straggler"] == 1 and "straggler" in flagged[0]["kinds"]
        assert flagged[0]["rank_step_s"][1] >= sc.SLOW_S > flagged[0]["rank_step_s"][0]
        assert all(s["straggler"] in (None, 1) for s in steps)  # rank 0 is never blamed
        assert all(s["tokens_per_s"] > 0 and 0 < s["mfu"] < 1 and s["global_tokens"] == 64 for s in steps)
    assert [s["straggler"] for s in ranks[0]] == [s["straggler"] for s in ranks[1]]  # every rank names the same


@pytest.mark.parametrize("how", ["hung", "frozen"])
def test_stopped_rank_is_found_in_bounded_time(how: str, tmp_path: pathlib.Path) -> None:
    start = time.monotonic()
    with pytest.raises(MeshError) as info:
        run_world(sc.stop, 2, how, str(tmp_path), timeout=300, backend="gloo", group_timeout_s=300)
    elapsed = time.monotonic() - start
    assert elapsed < 90, f"took {elapsed:.0f} s; the collective timeout is 300 s"  # start-up + 3 s + exit
    assert "75" in str(info.value)  # HEALTH_EXIT_CODE: an elastic agent restarts the job
    incident = json.loads((tmp_path / "incident-rank0.json").read_text())
    kind = "hung_rank" if how == "hung" else "dead_rank"
    assert incident["anomaly"]["kind"] == kind and incident["anomaly"]["rank"] == 1
    if how == "hung":  # the hung rank's own heartbeat names it too
        assert json.loads((tmp_path / "incident-rank1.json").read_text())["anomaly"]["rank"] == 1


def test_a_single_slow_step_is_no_straggler_a_persistent_one_is() -> None:
    mon = TrainingHealthMonitor()  # the defaults a session uses
    healthy = [[0.25, 0.44], [0.25, 0.26], [0.40, 0.25], [0.25, 0.25], [0.25, 0.45], [0.26, 0.25]]  # shared cores
    assert [a for step, times in enumerate(healthy) for a in mon.observe_rank_times(step, times)] == []
    slow = [mon.observe_rank_times(10 + i, [0.25, 0.60]) for i in range(4)]
    assert [len(found) for found in slow] == [0, 0, 1, 0] and slow[2][0].rank == 1
    one = TrainingHealthMonitor(straggler_steps=1)  # asked for: every slow step
    assert one.observe_rank_times(0, [0.25, 0.44])[0].rank == 1
    with pytest.raises(ValueError, match="straggler_steps must be an int >= 1"):
        TrainingHealthMonitor(straggler_steps=0)


def test_monitor_rules() -> None:
    mon = TrainingHealthMonitor(loss_window=6, loss_min_periods=4, plateau_rel_tol=1e-3)
    kinds = []
    for step, loss in enumerate([3.0, 2.9, 2.8, 2.75, 2.7, 40.0, 2.6, 2.6, 2.6, 2.6, 2.6, 2.6, 2.6, float("nan")], 1):
        kinds.append([a.kind for a in mon.observe_step(step, loss, grad_norm=1.0)])
    assert kinds[5] == ["loss_spike"]  # step 6, scored against the 5 steps before it
    assert sum(k == ["loss_plateau"] for k in kinds) == 1  # once per plateau
    assert kinds[-1] == ["nan_inf_loss"]
    assert mon.observe_step(20, 9.0, restart=True)[0].kind == "restart_discontinuity" and not mon.continuity_ok()
    assert mon.observe_rank_times(21, [0.10, 0.11, 0.45, 0.10]) == []  # one slow step is noise (issue 35)
    assert mon.observe_rank_times(22, [0.10, 0.12, 0.11, 0.10]) == []
    assert mon.observe_rank_times(23, [0.10, 0.11, 0.45, 0.10]) == []
    assert mon.observe_rank_times(24, [0.10, 0.11, 0.46, 0.10]) == []
    (straggler,) = mon.observe_rank_times(25, [0.10, 0.11, 0.47, 0.10])  # the third slow step in a row
    assert (straggler.rank, straggler.kind) == (2, "straggler") and "3 steps in a row" in straggler.detail
    assert mon.observe_rank_times(26, [0.10, 0.11, 0.47, 0.10]) == []  # once per streak
    mon.observe_rank_step(0, 1)
    mon.observe_rank_step(1, 60)
    assert [a.rank for a in mon.check_rank_liveness(60)] == [0] and mon.check_rank_liveness(61) == []
    with pytest.raises(ValueError, match="increase strictly.*step number above 60"):
        mon.observe_rank_step(1, 60)
    report = mon.report()
    assert json.loads(json.dumps(report))["anomalies_by_kind"]["loss_spike"] == 1
    with pytest.raises(ValueError, match="increase strictly"):
        mon.observe_step(5, 1.0)


def test_flops_and_baseline() -> None:
    cfg = ModelFlopConfig(n_params=1000, n_layer=2, n_head=2, d_model=8, seq_len=4)
    assert cfg.flops_per_token == 6 * 1000 + 12 * 2 * 8 * 4
    assert theoretical_flops_per_iter(n_params=1000, n_layer=2, n_head=2, d_model=8, seq_len=4,
                                      batch_size=3) == cfg.flops_per_token * 4 * 3
    with pytest.raises(ValueError, match="divisible"):
        ModelFlopConfig(n_params=1, n_layer=1, n_head=3, d_model=8, seq_len=1)
    b = RollingBaseline(window=4, min_periods=3)
    for v in (1.0, 2.0, 3.0):
        b.update(v)
    med, mad = b.baseline()
    assert med == 2.0 and math.isclose(mad, 1.4826)
    assert RollingBaseline.from_state(b.state()).baseline() == b.baseline()


class _Store:
    """The process group store's three calls, in memory."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def check(self, keys: list[str]) -> bool:
        return all(k in self.values for k in keys)

    def get(self, key: str) -> bytes:
        return self.values[key].encode()


@pytest.mark.parametrize("still", [True, False], ids=["frozen", "sleeping"])
def test_the_rank_the_others_wait_for_is_dead_when_its_beat_is_still_too(still: bool) -> None:
    """Rank 0 has waited in its backward past hung_after_s; rank 1, outside a collective, is the one it waits for:
    hung while its heartbeat goes on, dead when its beat has been still for half of dead_after_s (a frozen rank
    meets both deadlines together; the hung one used to win the race on a loaded machine)."""
    from mixle_parallel.executors.torch.heartbeat import Heartbeat

    store = _Store()
    beat = Heartbeat(store, rank=0, world_size=2, on_failure=lambda a: None, interval_s=0.2, dead_after_s=3.0,
                     hung_after_s=3.0)
    t0 = time.monotonic()
    beat.set_phase("backward", step=0)
    beat._phase_since = t0 - 1.05
    beat._publish()  # rank 0's own beat: in its backward
    store.set("1", json.dumps({"beat": 5, "step": 0, "phase": "idle", "phase_age": 0.1}))
    assert beat.check(t0) is None  # rank 1's beat first seen now
    if not still:
        store.set("1", json.dumps({"beat": 6, "step": 0, "phase": "idle", "phase_age": 1.9}))
        assert beat.check(t0 + 1.9) is None
    found = beat.check(t0 + 2.0)  # rank 0 in its backward for 3.05 s; rank 1 still for 2.0 s (or 0.1 s)
    assert found is not None and found.rank == 1
    assert found.kind == ("dead_rank" if still else "hung_rank")
