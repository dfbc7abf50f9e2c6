"""Checkpoints across real gloo process worlds: FSDP2 over dp_shard=4, reloaded at 4, 2 and 1.

One world-4 run trains, saves, continues uninterrupted (the reference), reloads at world 4,
refuses a corrupted copy and checks the asynchronous save; worlds 2 and 1 then reload the same
checkpoint, resharded. Scenarios: tests/torch/checkpoint_procs.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is the optional [torch] extra")
from tests.torch.checkpoint_procs import RESUME_STEPS, launch_world, resume_close  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def world4(root):
    return launch_world("world4", 4, root, root / "out4")


def test_world4_save_reload_is_exact(world4):
    reference = world4[0]["reference_losses"]
    assert len(reference) == RESUME_STEPS
    for rank, result in enumerate(world4):
        assert result["sync_done"] is True
        assert result["reference_losses"] == reference  # the global loss is the same on every rank
        loaded = result["same_world_loaded"]
        assert loaded["session_state"] == {"step": 3, "pending_accumulation": 0, "optimizer_receipt": {"name": "SGD"}}
        assert loaded["loader_state"] == {"epoch": 0, "samples_consumed": 24}
        assert result["same_world_typed_scheduler_state"] == "{'gamma': 0.5, 'kind': 'step', 'milestones': (2, 4)}"
        assert loaded["extra"] == {"best_loss": float("inf"), "note": "checkpoint test"}
        assert (loaded["saved_world_size"], loaded["world_size"], loaded["rng"]) == (4, 4, "restored")
        # same world, same kernels, same reduction order: bitwise-equal losses and schedule
        assert result["same_world_losses"] == reference, rank
        assert result["same_world_lr"] == result["reference_lr"]
        assert result["same_world_rand"] == result["rand_after_save"], rank  # rank r got rank r's RNG
    assert len({tuple(r["rand_after_save"]) for r in world4}) == 4  # ... and the ranks' RNGs differ


def test_world4_corrupted_copy_is_refused_on_every_rank(world4):
    culprit = world4[0]["corrupted_file"]
    for result in world4:
        error = result["corrupt_error"]
        assert error["type"] == "CorruptCheckpointError" and error["path"] == culprit
        assert culprit in error["message"] and "sha256 differs" in error["message"]
        assert result["corrupt_left_params_unchanged"] is True


def test_world4_async_save_lets_training_continue(world4):
    for result in world4:
        # two training steps (with their collectives) ran while every rank's write was held back
        assert len(result["async_steps_while_pending"]) == 2
        assert result["async_done_before_release"] is False
        assert result["async_pointer_before_release"] is False  # not published before written
        assert result["params_moved_meanwhile"] is True
        assert result["async_done_after_wait"] is True
        # what was saved is the state at the save call, not the state after the later steps
        assert result["async_loaded_step"] == 7
        assert result["async_params_equal_at_save"] is True
        assert result["drained_generation"] == "gen-00000002"
        assert result["drained_params_equal"] is True


@pytest.mark.parametrize("world", [2, 1])
def test_resharded_resume_matches_uninterrupted_run(world4, root, world):
    results = launch_world("resharded", world, root, root / f"out{world}")
    reference, ref_params = world4[0]["reference_losses"], world4[0]["reference_params"]
    for rank, result in enumerate(results):
        refused = result["refused"]
        assert refused["type"] == "WorldSizeChangeError"
        assert f"saved at world size 4 and is being loaded at world size {world}" in refused["message"]
        assert "allow_world_size_change=True" in refused["message"]
        assert result["refused_left_params_unchanged"] is True
        loaded = result["loaded"]
        assert (loaded["saved_world_size"], loaded["world_size"], loaded["rng"]) == (4, world, "rederived")
        assert loaded["loader_state"] == {"epoch": 0, "samples_consumed": 24}  # the common global position
        assert loaded["session_state"]["step"] == 3
        assert result["rand"] == result["rand_by_rule"], rank  # seeded by the documented rule
        # fp32 tolerance (checkpoint_procs.RTOL, ATOL) against the uninterrupted world-4 run
        assert resume_close(result["losses"], reference), (world, result["losses"], reference)
        for name, values in ref_params.items():
            assert resume_close(result["params"][name], values), name
        assert result["lr"] == world4[0]["reference_lr"]
        torn = result["torn_error"]
        assert torn["type"] == "CorruptCheckpointError" and torn["path"].endswith(f"torn{world}/LATEST")
    if world > 1:
        assert results[0]["rand"] != results[1]["rand"]
