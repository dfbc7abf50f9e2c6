"""StreamingTokenEncodedData in one process: input checks before any process group, and training vs the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from mixle_parallel.executors.torch.streaming_tokens import StreamingTokenEncodedData, TrainedTokenModel
from mixle_parallel.executors.torch.token_windows import rank_window_schedule, window_batches
from tests.torch import _streaming_scenarios as sc


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


class _Estimator:
    def __init__(self, module: torch.nn.Module, lr: float = sc.LR) -> None:
        self.module, self.lr, self.device = module, lr, "cpu"


BAD_INPUTS = [
    (dict(token_ids=np.zeros((3, 4))), ValueError, "1-D"),
    (dict(token_ids=[0.5, 1, 2, 3, 4, 5]), ValueError, "fractional"),
    (dict(token_ids=[0, 1, -2, 3, 4, 5]), ValueError, "negative"),
    (dict(token_ids=["a", "b"]), TypeError, "integers"),
    (dict(block=0), ValueError, "block must be >= 1"),
    (dict(batch_size=2.0), TypeError, "batch_size must be an int"),
    (dict(epochs=-1), ValueError, "epochs"),
    (dict(shuffle="false"), TypeError, "shuffle must be True or False"),
    (dict(parallel="zero3"), ValueError, "parallel='zero3'"),
    (dict(precision="fp8"), ValueError, "precision='fp8'"),
    (dict(backend="mpi"), ValueError, "backend='mpi'"),
    (dict(tp_size=2), ValueError, "tp_size=2 cannot run here"),
    (dict(session_options={"lr": 1.0}), ValueError, "unknown key"),
    (dict(block=40), ValueError, "no window of block=40"),
]


@pytest.mark.parametrize(("override", "error", "message"), BAD_INPUTS)
def test_bad_input_is_refused_before_any_process_group(override: dict, error: type, message: str) -> None:
    kwargs = {"token_ids": sc.TOKENS, "block": sc.BLOCK, "batch_size": sc.BATCH, **override}
    with pytest.raises(error, match=message):
        StreamingTokenEncodedData(kwargs.pop("token_ids"), **kwargs)
    assert not dist.is_initialized()


def test_a_too_short_shard_is_refused_before_the_group_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun says 4 ranks: 6 tokens give shards of 1-2 tokens, none longer than block=4
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="no rank's shard holds more than block=4"):
        StreamingTokenEncodedData(np.arange(6), block=4, batch_size=2)
    assert not dist.is_initialized()


def test_without_init_a_torchrun_environment_runs_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    handle = StreamingTokenEncodedData(np.arange(25), block=4, batch_size=4, init_process_group=False)
    assert (handle.rank, handle.world) == (0, 1)  # init_process_group=False: one process, as mixle runs it
    assert handle._ids.base is None  # its own copy of the ids


def test_schedule_pads_to_the_longest_rank() -> None:
    schedule = rank_window_schedule(25, 2, block=4, batch_size=4, shard_by_rank=True)
    assert schedule.window_counts == (8, 9) and schedule.steps_per_epoch == 3
    assert [schedule.real_targets(s, 4) for s in range(3)] == [8, 8, 1]
    unsharded = rank_window_schedule(25, 2, block=4, batch_size=4, shard_by_rank=False)
    assert unsharded.window_counts == (21, 21) and unsharded.steps_per_epoch == 6


def test_window_batches_follow_the_seeded_order() -> None:
    ids = np.arange(10)
    batches = list(window_batches(ids, block=3, batch_size=4, shuffle=True, seed=5))
    order = np.random.RandomState(5).permutation(7)
    assert [len(y) for _, y in batches] == [4, 3]
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), order + 3)
    np.testing.assert_array_equal(batches[0][0][0], np.arange(order[0], order[0] + 3))


def test_one_process_trains_like_the_reference() -> None:
    handle = StreamingTokenEncodedData(sc.TOKENS, block=sc.BLOCK, batch_size=sc.BATCH, epochs=sc.EPOCHS)
    assert not handle.owns_process_group and handle.plan().world_size == 1
    fitted = handle.pysp_seq_estimate(_Estimator(sc.fresh_model()), None)
    assert isinstance(fitted, TrainedTokenModel)
    ref = sc.reference(sc.TOKENS, 1)
    for name, want in ref["params"].items():
        torch.testing.assert_close(fitted.module.state_dict()[name], want, rtol=1e-5, atol=1e-6)
    assert len(handle.receipts) == len(ref["losses"]) == 2 * 6
    assert [r.loss for r in handle.receipts] == pytest.approx(ref["losses"], rel=1e-5)
    assert all(r.extra["collectives"] == {} for r in handle.receipts)  # one process: nothing communicated
    count, total = handle.pysp_seq_log_density_sum(fitted)
    assert count == len(sc.TOKENS) - sc.BLOCK and total < 0
    handle.close()


def test_estimator_without_a_module_or_blocks_is_refused() -> None:
    handle = StreamingTokenEncodedData(sc.TOKENS, block=sc.BLOCK, batch_size=sc.BATCH)
    with pytest.raises(TypeError, match="must carry a torch.nn.Module"):
        handle.pysp_seq_estimate(object(), None)
    with pytest.raises(ValueError, match="lr must be a finite number"):
        handle.pysp_seq_estimate(_Estimator(sc.fresh_model(), lr=-1.0), None)
    checkpointed = StreamingTokenEncodedData(sc.TOKENS, block=sc.BLOCK, batch_size=sc.BATCH,
                                             activation_checkpointing=True)
    with pytest.raises(ValueError, match=r"nn.ModuleList \.blocks"):
        checkpointed.pysp_seq_estimate(_Estimator(sc.fresh_model()), None)
    init = handle.pysp_seq_initialize(_Estimator(sc.fresh_model()), np.random.RandomState(0), 0.5)
    assert isinstance(init, TrainedTokenModel) and handle.receipts == ()


def test_a_module_with_the_wrong_output_shape_is_named() -> None:
    class AllPositions(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(sc.VOCAB, sc.VOCAB)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.embed(x)  # (batch, block, vocab): every position, not the next token's

    handle = StreamingTokenEncodedData(sc.TOKENS, block=sc.BLOCK, batch_size=sc.BATCH)
    with pytest.raises(ValueError, match=r"logits shaped \(batch, vocab\)"):
        handle.pysp_seq_estimate(_Estimator(AllPositions()), None)
