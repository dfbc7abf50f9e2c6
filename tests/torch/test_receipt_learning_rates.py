"""Receipts carry each parameter group's learning rate; ``scheduler=`` steps once per committed update."""

from __future__ import annotations

import json

import pytest
import torch

from mixle_parallel.contracts import ContractError, ParallelPlan, StepReceipt, from_json, to_json
from mixle_parallel.executors.torch.backend import TorchDistributedBackend
from tests.torch._models import global_batches, make_model


def _two_groups(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": params[:2], "lr": 0.1}, {"params": params[2:], "lr": 0.01}])


def test_each_receipt_names_the_rate_of_every_group_the_step_used() -> None:
    session = TorchDistributedBackend().prepare(
        make_model(), plan=ParallelPlan(gradient_accumulation_steps=2), optimizer=_two_groups, health=False,
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    receipts = [session.train_batch(*b[0]) for b in global_batches(6, [4], seed=2)]
    session.close()
    committed = [r for r in receipts if not r.skipped]
    assert [r.step for r in committed] == [1, 2, 3]
    # the rate each update used (the scheduler halves it after every committed step, not every call)
    assert [r.learning_rates for r in committed] == [(0.1, 0.01), (0.05, 0.005), (0.025, 0.0025)]
    # an accumulating call names the rate its window will commit with
    assert [r.learning_rates for r in receipts if r.skipped] == [(0.1, 0.01), (0.05, 0.005), (0.025, 0.0025)]
    back = from_json(to_json(committed[1]), StepReceipt)
    assert back.learning_rates == (0.05, 0.005)
    assert json.loads(to_json(committed[0]))["data"]["learning_rates"] == [0.1, 0.01]


def test_a_receipt_refuses_a_rate_that_is_not_a_finite_number() -> None:
    fields = dict(step=1, loss=1.0, local_examples=1, local_tokens=1, microbatches=1, accumulation_steps=1,
                  data_parallel_size=1, optimizer="SGD", precision="fp32")
    assert StepReceipt(**fields).learning_rates == ()  # an executor that cannot read the groups says nothing
    for bad in ((float("nan"),), (-0.1,), ("0.1",), 0.1):
        with pytest.raises(ContractError, match="learning_rates"):
            StepReceipt(**fields, learning_rates=bad)


def test_a_scheduler_factory_must_return_a_scheduler() -> None:
    with pytest.raises(TypeError, match=r"scheduler= must be callable\(optimizer\) returning an object with step"):
        TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(), optimizer="SGD", health=False,
                                          scheduler=lambda opt: 0.5)
