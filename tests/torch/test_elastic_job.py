"""fault_tolerant_training's in-process elastic job (mixle's StepResult, SimulatedRank, ElasticTrainingJob).

Threads stand in for ranks (mixle's design); what is real is the rendezvous, the averaging, the
checkpoints and the loader bookkeeping. Every test compares against a plain single-model loop on
the same rows, so "no batch skipped or repeated" is checked on the parameters, not on counters.
"""

from __future__ import annotations

import pathlib
import threading

import pytest
import torch

import mixle_parallel
from mixle_parallel.dcp_checkpoint import load_training_metadata
from mixle_parallel.executors.torch.checkpoint_manifest import CheckpointError
from mixle_parallel.fault_tolerant_training import (
    ElasticTrainingJob,
    LoaderState,
    SimulatedRank,
    StepResult,
    load_checkpoint,
    load_checkpoint_extra,
)

FEATURES, CLASSES, ROWS = 3, 4, 2


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, CLASSES)


def batch(rank: int, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch ``idx``: a pure function of the two."""
    g = torch.Generator().manual_seed(1000 * rank + idx)
    return torch.randn(ROWS, FEATURES, generator=g), torch.randint(0, CLASSES, (ROWS,), generator=g)


def batch_fn(rank: int, state: LoaderState) -> tuple[torch.Tensor, torch.Tensor]:
    return batch(rank, state.batch_idx)


def reference(steps: list[list[tuple[int, int]]], lr: float = 0.1) -> torch.nn.Module:
    """Plain SGD on one model; step i trains on the concatenated batches ``(rank, idx)`` of ``steps[i]``."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for rows in steps:
        x = torch.cat([batch(r, i)[0] for r, i in rows])
        y = torch.cat([batch(r, i)[1] for r, i in rows])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)  # fp32, different summation order


def test_names_are_mixles() -> None:
    assert mixle_parallel.ElasticTrainingJob is ElasticTrainingJob
    assert mixle_parallel.SimulatedRank is SimulatedRank and mixle_parallel.StepResult is StepResult


def test_simulated_rank_holds_at_the_rendezvous() -> None:
    model = make_model()
    rank = SimulatedRank(1, make_model, lambda: batch(1, 0))
    rank.start_step(3, model.state_dict())
    assert rank.wait_started(30)
    assert rank.in_flight  # computed, held before the update
    with pytest.raises(RuntimeError, match="still has step 3 in flight"):
        rank.start_step(4, model.state_dict())
    rank.release()
    result = rank.join(30)
    assert isinstance(result, StepResult) and (result.rank, result.step, result.examples) == (1, 3, ROWS)
    x, y = batch(1, 0)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert result.loss == pytest.approx(float(loss.detach()))
    for g, p in zip(result.grads, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    rank.start_step(4, model.state_dict())  # a cancelled step yields no result
    assert rank.wait_started(30)
    rank.cancel()
    assert rank.join(30) is None


def test_simulated_rank_errors_are_clear() -> None:
    bad = SimulatedRank(0, make_model, lambda: (torch.zeros(2, FEATURES), torch.zeros(3, dtype=torch.long)))
    bad.start_step(0, make_model().state_dict())
    assert bad.wait_started(30)
    with pytest.raises(RuntimeError, match=r"rank 0 failed step 0: ValueError.*same non-empty batch"):
        bad.join(30)
    with pytest.raises(TypeError, match="batch_fn must be callable"):
        SimulatedRank(0, make_model, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hold_timeout_s must be a finite"):
        SimulatedRank(0, make_model, lambda: batch(0, 0), hold_timeout_s=0)
    held = SimulatedRank(0, make_model, lambda: batch(0, 0), hold_timeout_s=0.05)
    held.start_step(0, make_model().state_dict())
    assert held.join(30) is None  # never released: it gives up on its own instead of waiting forever


def test_killed_rank_is_dropped_and_respawned_without_repeats(tmp_path: pathlib.Path) -> None:
    job = ElasticTrainingJob(make_model, 3, batch_fn, str(tmp_path / "ck"), lr=0.1, step_timeout_s=30)
    try:
        job.run_step(0)
        job.checkpoint().wait(120)  # rank 1 saved at batch 1
        job.run_step(1)  # rank 1 commits batch 1 after the checkpoint
        record = job.run_step(2, kill_ranks={1})  # killed after its backward: batch 2 of rank 1 is not trained
        assert record["survivors"] == [0, 2] and record["newly_dead"] == [1] and job.dead_ranks == {1}
        assert job.loader_states[1].batch_idx == 2 and job.loader_states[0].batch_idx == 3
        job.run_step(3)  # the survivors go on
        resumed = job.respawn_rank(1)  # from the checkpoint at batch 1, but batch 1 was committed since
        assert resumed.batch_idx == 2  # mixle would go back to 1 and train batch 1 twice
        record = job.run_step(4)
        assert record["restart"] and record["survivors"] == [0, 1, 2]
        assert job.health.report()["restarts"]["steps"] == [4]
    finally:
        job.close()
    expected = [[(0, 0), (1, 0), (2, 0)], [(0, 1), (1, 1), (2, 1)], [(0, 2), (2, 2)], [(0, 3), (2, 3)],
                [(0, 4), (1, 2), (2, 4)]]
    assert_same_params(job.canonical_model, reference(expected))


def test_checkpoint_holds_weights_positions_and_clock(tmp_path: pathlib.Path) -> None:
    job = ElasticTrainingJob(make_model, 2, batch_fn, str(tmp_path / "ck"), lr=0.1, step_timeout_s=30)
    try:
        job.run_step(10)
        job.run_step(11, kill_ranks={1})
        job.checkpoint().wait(120)
    finally:
        job.close()
    path = str(tmp_path / "ck")
    extra = load_checkpoint_extra(path)
    assert extra["last_step"] == 11 and extra["world_size"] == 2
    assert {r: LoaderState.from_dict(d).batch_idx for r, d in extra["loader_states"].items()} == {"0": 2, "1": 1}
    assert load_training_metadata(path)["step"] == 2  # updates committed
    model = torch.nn.Linear(FEATURES, CLASSES)
    assert load_checkpoint(model, torch.optim.SGD(model.parameters(), lr=0.1), path) == job.loader_states[0]
    assert_same_params(model, job.canonical_model)


def test_failing_and_hung_ranks_are_dropped_within_the_step_timeout(tmp_path: pathlib.Path) -> None:
    release = threading.Event()

    def flaky(rank: int, state: LoaderState) -> tuple[torch.Tensor, torch.Tensor]:
        if state.batch_idx == 1 and rank == 1:
            raise OSError("disk gone")
        if state.batch_idx == 1 and rank == 2:
            release.wait(60)  # hangs past the step timeout
        return batch(rank, state.batch_idx)

    job = ElasticTrainingJob(make_model, 3, flaky, str(tmp_path / "ck"), lr=0.1, step_timeout_s=3.0)
    try:
        job.run_step(0)
        record = job.run_step(1)
        release.set()
        assert record["survivors"] == [0] and record["newly_dead"] == [1, 2]
        assert "OSError('disk gone')" in record["rank_failures"][1]
        assert "within step_timeout_s=3.0 s" in record["rank_failures"][2]
        with pytest.raises(ValueError, match="step 1 must be greater than the last committed step 1"):
            job.run_step(1)
        with pytest.raises(ValueError, match=r"kill_ranks \[2\] are already dead"):
            job.run_step(2, kill_ranks={2})
        with pytest.raises(RuntimeError, match="step 2 not committed: every live rank died"):
            job.run_step(2, kill_ranks={0})
        with pytest.raises(RuntimeError, match="every rank is dead"):
            job.run_step(2)
    finally:
        job.close()
    assert_same_params(job.canonical_model, reference([[(0, 0), (1, 0), (2, 0)], [(0, 1)]]))


def test_respawn_and_constructor_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        ElasticTrainingJob(make_model, 0, batch_fn, str(tmp_path))
    with pytest.raises(TypeError, match="model_factory must return a torch.nn.Module"):
        ElasticTrainingJob(lambda: "model", 2, batch_fn, str(tmp_path))
    with pytest.raises(ValueError, match="step_timeout_s must be a finite"):
        ElasticTrainingJob(make_model, 2, batch_fn, str(tmp_path), step_timeout_s=float("inf"))
    job = ElasticTrainingJob(make_model, 2, batch_fn, str(tmp_path / "ck"), step_timeout_s=30)
    try:
        with pytest.raises(CheckpointError, match="no checkpoint at"):
            job.respawn_rank(0)  # a live rank may be replaced (mixle's behaviour), but only from a checkpoint
        with pytest.raises(ValueError, match=r"kill_ranks \[5\] are outside the world of 2"):
            job.run_step(0, kill_ranks={5})
        errors: list[BaseException] = []
        other = threading.Thread(target=lambda: _capture(errors, job.run_step, 0))
        other.start()
        other.join(30)
        assert "run_step() called from thread" in str(errors[0])
        assert "another thread than the one that built the job" in str(errors[0])
    finally:
        job.close()


def _capture(errors: list[BaseException], fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except BaseException as err:  # noqa: BLE001 - the test inspects it
        errors.append(err)


def test_a_live_rank_is_replaced_at_the_committed_position(tmp_path: pathlib.Path) -> None:
    """respawn_rank on a live rank (mixle allows it) replaces its thread; it resumes where it was committed."""
    job = ElasticTrainingJob(make_model, 2, batch_fn, str(tmp_path / "ck"), step_timeout_s=30)
    try:
        job.run_step(0)
        job.checkpoint().wait()
        job.run_step(1)
        before = job.loader_states[0]
        assert job.respawn_rank(0) == before
        record = job.run_step(2)
        assert record["restart"] and record["survivors"] == [0, 1]
    finally:
        job.close()
