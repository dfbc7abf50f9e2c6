"""End to end through the torch_native session: save at dp_shard=4, resume at dp_shard=2 and world 1.

TinyLM with the default token cross-entropy, SGD + momentum, StepLR. Scenarios:
tests/torch/checkpoint_procs.py (``session4``, ``session_resharded``).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is the optional [torch] extra")
from tests.torch.checkpoint_procs import RESUME_STEPS, START_STEP, launch_world, resume_close  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("session_checkpoints")


@pytest.fixture(scope="module")
def session4(root):
    return launch_world("session4", 4, root, root / "out4")


def test_session_async_save_resumes_the_state_at_the_call(session4):
    for result in session4:
        assert result["generation"] == "gen-00000001"
        assert len(result["async_steps"]) == 2  # training steps issued before wait()
        assert result["async_step"] == START_STEP + RESUME_STEPS  # the clock at the save call
        assert result["async_equal"] is True  # parameters as at the save call, not after the steps


@pytest.mark.parametrize("world", [2, 1])
def test_session_resharded_resume_matches_uninterrupted_run(session4, root, world):
    results = launch_world("session_resharded", world, root, root / f"out{world}")
    reference, ref_params = session4[0]["reference_losses"], session4[0]["reference_params"]
    for result in results:
        assert result["refused"]["type"] == "WorldSizeChangeError"
        assert "allow_world_size_change=True" in result["refused"]["message"]
        assert result["loaded"] == {"loader_state": {"epoch": 0, "samples": 24}, "extra": {"run": "e2e"},
                                    "saved_world_size": 4, "world_size": world, "rng": "rederived"}
        assert result["state"] == {"step": START_STEP, "pending": 0}
        # every loss and every parameter within the fp32 tolerance above
        assert resume_close(result["losses"], reference), (world, result["losses"], reference)
        for name, values in ref_params.items():
            assert resume_close(result["params"][name], values), name


def test_session_refuses_to_save_mid_accumulation_and_restores_its_clock(tmp_path):
    import torch

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend
    from tests.torch._models import SEQ, VOCAB, TinyLM

    def prepare(seed):
        torch.manual_seed(seed)
        return get_training_backend("torch_native").prepare(
            TinyLM(), plan=ParallelPlan(gradient_accumulation_steps=2), optimizer="SGD", lr=0.1)

    tokens = torch.randint(0, VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(0))
    session = prepare(0)
    session.train_batch(tokens[:, :-1], tokens[:, 1:])
    with pytest.raises(ValueError, match="cannot save mid-accumulation"):
        session.save_checkpoint(str(tmp_path))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    session.finish_accumulation()
    session.save_checkpoint(str(tmp_path), typed_scheduler_state={"warmup": 0})
    other = prepare(1)
    loaded = other.load_checkpoint(str(tmp_path))
    assert (other.step, other.pending_accumulation) == (1, 0) and loaded["typed_scheduler_state"] == {"warmup": 0}
    assert all(torch.equal(a, b) for a, b in zip(other.module.parameters(), session.module.parameters()))
    session.close()
    other.close()
