"""DDP with parameters that get no gradient: named in the first line of the error, with what to do, at
``prepare`` where the in-situ probe can tell and at the first step otherwise; ``find_unused_parameters=True``
trains; cleanup after a failure never raises over it (issue 35 item 1). Before: ``RuntimeError: no DDP bucket
was reduced in the commit's backward``, or on a fresh store an 82-line traceback chaining ``NotAdmittedError``
with ``PendingGradientsError``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from mixle_parallel.contracts import ParallelPlan, UnusedParametersError
from mixle_parallel.executors.torch.backend import TorchDistributedBackend
from mixle_parallel.executors.torch.session_base import PendingGradientsError
from tests.torch._models import global_batches, make_model
from tests.torch._world import run_world

NAMED = "parameters unused.weight, unused.bias got no gradient in "


@pytest.mark.slow
def test_unused_parameters_are_named_at_prepare_and_at_the_first_step(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "fresh-home"))  # no certificate, no key
    monkeypatch.delenv("MIXLE_PARALLEL_CERTIFICATE", raising=False)
    results = run_world(2, "tests.torch._unused_scenarios", "unused_parameters")
    for rank, found in enumerate(results):
        at_prepare = found["at_prepare"]
        assert at_prepare is not None, f"rank {rank}: prepare accepted a DDP module with unused parameters"
        assert at_prepare["type"] == "UnusedParametersError", at_prepare["traceback"]
        assert at_prepare["first_line"].startswith(NAMED + "a probe step of the module")
        assert "find_unused_parameters=True" in at_prepare["first_line"] and "FSDP2" in at_prepare["first_line"]
        assert at_prepare["names"] == ["unused.weight", "unused.bias"]
        for hidden in ("PendingGradientsError", "NotAdmittedError", "During handling"):
            assert hidden not in at_prepare["traceback"], at_prepare["traceback"]

        with_option = found["with_option"]
        assert with_option["admission"] == "certified" and with_option["steps"] == [1, 2]
        assert with_option["audited"] is True  # the first step's audit replays it too
        assert with_option["changed"] == ["used.bias", "used.weight"]  # the unused layer is left as it was

        assert found["admission_without_option"] == "certified"  # the stored certificate: no probe ran
        at_step = found["at_step"]
        assert at_step is not None and at_step["type"] == "UnusedParametersError", at_step
        assert at_step["first_line"].startswith(NAMED + "step 1's backward")
        assert "find_unused_parameters=True" in at_step["first_line"]
        assert "PendingGradientsError" not in at_step["traceback"], at_step["traceback"]


def test_find_unused_parameters_is_refused_where_ddp_does_not_run() -> None:
    for plan in (ParallelPlan(dp_shard=2), ParallelPlan()):
        with pytest.raises(ValueError, match=r"find_unused_parameters=True is DDP's .* drop it"):
            TorchDistributedBackend().prepare(make_model(), plan=plan, find_unused_parameters=True)
    with pytest.raises(TypeError, match="find_unused_parameters must be True or False"):
        TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(dp_replicate=2), find_unused_parameters=1)
    assert not torch.distributed.is_initialized()


def test_close_during_a_failure_never_raises_over_it(caplog: pytest.LogCaptureFixture) -> None:
    batches = global_batches(2, [4], seed=3)
    session = TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(gradient_accumulation_steps=2),
                                                optimizer="SGD", lr=0.1, health=False)
    session.train_batch(*batches[0][0])  # one micro-step pending
    with pytest.raises(PendingGradientsError, match="cannot close mid-accumulation"):
        session.close()  # a plain close still refuses to drop gradients silently
    with caplog.at_level(logging.WARNING), pytest.raises(KeyError, match="the script's own error") as info:
        try:
            raise KeyError("the script's own error")
        finally:
            session.close()
    assert info.value.__context__ is None  # nothing chained over it
    assert "pending micro-step(s) of gradients are dropped" in caplog.text
    with pytest.raises(RuntimeError, match="closed"):
        session.train_batch(*batches[1][0])


def test_the_error_names_the_parameters_in_its_first_line() -> None:
    error = UnusedParametersError(["unused.weight", "unused.bias"], where="step 3's backward")
    first = str(error).splitlines()[0]
    assert first.startswith("parameters unused.weight, unused.bias got no gradient in step 3's backward")
    assert isinstance(error, RuntimeError) and isinstance(error, ValueError)
    many = UnusedParametersError([f"p{i}" for i in range(25)])
    assert "p19 and 5 more" in str(many)
