"""MegatronBridgeBackend: the plan and precision written into a provider; the admission gate before Bridge is
touched; only what these tests drive is claimed; the extra named where megatron-bridge is missing."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import types
from typing import Any

import pytest

from mixle_parallel import MegatronBridgeBackend, MissingExtraError, ParallelPlan, get_training_backend
from mixle_parallel.contracts import CapabilityError, NotAdmittedError
from mixle_parallel.megatron_training import MegatronBridgeSession

HAS_BRIDGE = importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.bridge")


class Provider:
    """The attribute surface of a Bridge model provider (GPTModelProvider's parallel sizes)."""

    def __init__(self) -> None:
        self.tensor_model_parallel_size = 1
        self.bf16, self.fp16 = False, False
        self.finalized = False
        self.provided: dict[str, Any] | None = None

    def finalize(self) -> Provider:
        self.finalized = True
        return self

    def provide_distributed_model(self, **kwargs: Any) -> str:
        self.provided = kwargs
        return "model"


def test_configure_provider_writes_the_plan() -> None:
    plan = ParallelPlan(dp_shard=2, tp=2, pp=2, cp=2, ep=2, etp=2)
    p = MegatronBridgeBackend.configure_provider(Provider(), plan)
    assert (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
            p.expert_model_parallel_size, p.expert_tensor_parallel_size, p.sequence_parallel) == (2, 2, 2, 2, 2, True)
    cfg = types.SimpleNamespace(use_distributed_optimizer=False, overlap_grad_reduce=False, overlap_param_gather=False)
    MegatronBridgeBackend.configure_distributed_optimizer(cfg, plan)
    assert (cfg.use_distributed_optimizer, cfg.overlap_grad_reduce, cfg.overlap_param_gather) == (True, True, True)
    assert MegatronBridgeBackend.configure_distributed_optimizer(None, plan) is None


def test_registered_and_exported() -> None:
    assert isinstance(get_training_backend("megatron_bridge"), MegatronBridgeBackend)


@pytest.mark.skipif(bool(HAS_BRIDGE), reason="megatron-bridge is installed")
def test_prepare_without_bridge_names_the_extra() -> None:
    with pytest.raises(MissingExtraError, match=r"mixle-parallel\[megatron-bridge\]"):
        MegatronBridgeBackend().prepare(Provider(), plan=ParallelPlan(tp=2), admission="unverified")
    with pytest.raises(MissingExtraError, match="megatron-bridge"):
        MegatronBridgeBackend().run_pretrain(types.SimpleNamespace(model=Provider()), lambda *a: None,
                                             plan=ParallelPlan(tp=2), admission="unverified")


def test_prepare_drives_the_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in module for megatron.bridge (not installed here: it needs CUDA-only packages); the
    # provider protocol it is driven through is the real one (finalize, provide_distributed_model).
    if not HAS_BRIDGE:
        monkeypatch.setitem(sys.modules, "megatron.bridge", types.ModuleType("megatron.bridge"))
    provider = Provider()
    ddp = types.SimpleNamespace(use_distributed_optimizer=False)
    calls: list[tuple[Any, ...]] = []
    session = MegatronBridgeBackend().prepare(
        provider, plan=ParallelPlan(dp_shard=2, tp=2), ddp_config=ddp, admission="unverified",
        train_batch_fn=lambda model, opt, x, y: calls.append((model, opt, x, y)) or 1.5, optimizer="opt")
    assert isinstance(session, MegatronBridgeSession) and session.module == "model"
    assert provider.finalized and provider.provided == {"wrap_with_ddp": True, "ddp_config": ddp}
    assert provider.tensor_model_parallel_size == 2 and ddp.use_distributed_optimizer is True
    import torch

    receipt = session.train_batch(torch.zeros(2, 4), torch.zeros(2, 4))
    assert calls and calls[0][:2] == ("model", "opt")
    assert (receipt.step, receipt.loss, receipt.local_examples, receipt.local_tokens) == (1, 1.5, 2, 8)
    assert receipt.extra["admission"] == "unverified" and (provider.bf16, provider.fp16) == (True, False)
    with pytest.raises(TypeError, match="no provide_distributed_model"):
        MegatronBridgeBackend().prepare(types.SimpleNamespace(bf16=False, fp16=False), plan=ParallelPlan(tp=2),
                                        admission="unverified")
    with pytest.raises(RuntimeError, match="run_pretrain"):
        MegatronBridgeBackend().prepare(Provider(), plan=ParallelPlan(tp=2), admission="unverified").train_batch(
            None, None)


def test_require_bridge_hook_can_be_replaced_per_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    # mixle 0.8.2's hook: prepare() asks the instance's _require_bridge, so a test can stand in for Bridge
    backend = MegatronBridgeBackend()
    monkeypatch.setattr(backend, "_require_bridge", lambda: object())
    provider = Provider()
    session = backend.prepare(provider, plan=ParallelPlan(dp_replicate=4, tp=2, pp=2, cp=2, ep=2, etp=2),
                              wrap_with_ddp=False, admission="unverified")
    assert session.module == "model" and provider.provided == {"wrap_with_ddp": False}
    assert (provider.pipeline_model_parallel_size, provider.context_parallel_size,
            provider.expert_model_parallel_size, provider.expert_tensor_parallel_size) == (2, 2, 2, 2)
    if not HAS_BRIDGE:
        with pytest.raises(MissingExtraError, match="megatron-bridge"):
            MegatronBridgeBackend()._require_bridge()


def _recording_bridge(monkeypatch: pytest.MonkeyPatch) -> tuple[MegatronBridgeBackend, list[str]]:
    """A backend whose Bridge stand-in records every time prepare()/run_pretrain() reach for Bridge."""
    backend, reached = MegatronBridgeBackend(), []
    monkeypatch.setattr(backend, "_require_bridge", lambda: reached.append("bridge"))
    return backend, reached


def test_prepare_passes_the_admission_gate_before_bridge_is_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, reached = _recording_bridge(monkeypatch)
    provider = Provider()
    with pytest.raises(NotAdmittedError, match="megatron_bridge on dp_shard=2 x tp=2.*admission='unverified'"):
        backend.prepare(provider, plan=ParallelPlan(dp_shard=2, tp=2))
    assert reached == [] and provider.finalized is False and provider.tensor_model_parallel_size == 1
    one = backend.prepare(Provider(), plan=ParallelPlan(), train_batch_fn=lambda *a: 0.5)  # one CPU process
    assert one.admission.mode == "local" and reached == ["bridge"]
    assert one.train_batch(None, None).extra["admission"] == "local"


def test_run_pretrain_passes_the_admission_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    backend, reached = _recording_bridge(monkeypatch)
    config = types.SimpleNamespace(model=Provider(), ddp=None)
    with pytest.raises(NotAdmittedError, match="megatron_bridge on tp=2"):
        backend.run_pretrain(config, lambda *a: None, plan=ParallelPlan(tp=2))
    monkeypatch.setenv("WORLD_SIZE", "4")  # no plan: the one the config will run on the launched ranks
    config.model.tensor_model_parallel_size = 2
    with pytest.raises(NotAdmittedError, match="megatron_bridge on dp_replicate=2 x tp=2"):
        backend.run_pretrain(config, lambda *a: None)
    assert reached == []


def test_bridge_claims_only_what_these_tests_drive() -> None:
    backend = MegatronBridgeBackend()
    with pytest.raises(CapabilityError, match="fp8"):  # nothing writes or runs an fp8 recipe
        backend.prepare(Provider(), plan=ParallelPlan(), precision="fp8", admission="unverified")
    with pytest.raises(CapabilityError, match="dp_replicate, dp_shard"):  # the distributed optimizer shards all dp
        backend.prepare(Provider(), plan=ParallelPlan(dp_replicate=2, dp_shard=2), admission="unverified")
    assert not backend.capabilities.reshardable_checkpoint  # Bridge's checkpoints are its own; none tested here


def test_bridge_writes_only_fields_megatron_core_defines(monkeypatch: pytest.MonkeyPatch) -> None:
    # Bridge's providers are megatron-core configs: a misspelt field would be set silently on any object
    pytest.importorskip("megatron.core", reason="megatron-core (the megatron extra) is not installed")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.model_parallel_config import ModelParallelConfig

    written: list[str] = []

    class Recording(Provider):
        def __setattr__(self, name: str, value: Any) -> None:
            written.append(name)
            object.__setattr__(self, name, value)

    recording = Recording()
    written.clear()
    plan = ParallelPlan(dp_shard=2, tp=2, pp=2, cp=2, ep=2, etp=2)
    for precision in ("fp32", "fp16", "bf16"):
        MegatronBridgeBackend.configure_precision(MegatronBridgeBackend.configure_provider(recording, plan), precision)
        assert (recording.bf16, recording.fp16) == (precision == "bf16", precision == "fp16")
    assert set(written) <= {f.name for f in dataclasses.fields(ModelParallelConfig)}
    ddp_fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    assert {"use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather"} <= ddp_fields
    with pytest.raises(TypeError, match="no bf16 or fp16 attribute"):
        MegatronBridgeBackend.configure_precision(types.SimpleNamespace(), "bf16")
