"""torch_native's default loss on mixle's own CausalLM (last-position logits unless return_all_logits=True)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors import get_training_backend
from mixle_parallel.executors.torch.losses import lm_token_loss

transformer = pytest.importorskip("mixle.models.transformer", reason="mixle is the [mixle] extra")


def _lm() -> nn.Module:
    torch.manual_seed(0)
    return transformer.build_causal_lm(vocab=32, d_model=16, n_layer=1, n_head=2, block=8)


def test_default_loss_asks_mixle_causal_lm_for_every_position() -> None:
    lm = _lm()
    x = torch.randint(0, 32, (3, 8))
    y = torch.randint(0, 32, (3, 8))
    y[0, :2] = -100
    loss_sum, count = lm_token_loss(lm, x, y)
    logits = lm(x, return_all_logits=True)
    expected = nn.functional.cross_entropy(logits.reshape(-1, 32), y.reshape(-1), reduction="sum", ignore_index=-100)
    assert int(count) == 3 * 8 - 2
    torch.testing.assert_close(loss_sum, expected, rtol=0, atol=0)  # the same computation, bit for bit


def test_mixle_causal_lm_trains_with_the_default_loss() -> None:
    session = get_training_backend("torch_native").prepare(_lm(), plan=ParallelPlan(), optimizer="SGD", lr=0.5)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 32, (4, 8), generator=gen)
    receipts = [session.train_batch(x, x.roll(-1, dims=1)) for _ in range(5)]
    assert [r.step for r in receipts] == [1, 2, 3, 4, 5]
    assert receipts[-1].loss < receipts[0].loss  # the same batch, five SGD steps
    assert receipts[0].global_tokens == 32 and receipts[0].global_examples == 4
    assert math.isfinite(receipts[-1].loss)
    session.close()


def test_default_loss_says_what_it_expects_from_a_last_position_model() -> None:
    class LastPosition(nn.Module):  # returns (batch, vocab): what CausalLM returns without the flag
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.emb(x)[:, -1]

    x = torch.randint(0, 32, (2, 8))
    with pytest.raises(ValueError, match=r"logits shaped targets.shape \+ \(vocab,\) = \(2, 8\).*got \(2, 32\)"):
        lm_token_loss(LastPosition(), x, x)
    with pytest.raises(TypeError, match="return a logits tensor, got tuple"):
        lm_token_loss(_TupleModel(), x, x)


class _TupleModel(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.float(),)
