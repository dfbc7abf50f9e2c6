"""Every training entry point with an unknown keyword and with each option on a backend that does not honour it.

The option list is built from the options objects (``train_keywords()``: TrainOptions' fields and the audit
keywords), so a new option cannot escape the walk. Everything here runs in one process and fails before any
process group exists.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors.megatron.bridge import MegatronBridgeBackend
from mixle_parallel.executors.torch.backend import TorchDistributedBackend
from mixle_parallel.executors.torch.session import TorchDistributedSession
from mixle_parallel.executors.torch.streaming_tokens import StreamingTokenEncodedData
from mixle_parallel.executors.training_options import (
    MEGATRON,
    MEGATRON_BRIDGE,
    TORCH_NATIVE,
    AuditMode,
    AuditOptions,
    HealthOptions,
    TrainOptions,
    train_keywords,
)
from mixle_parallel.verification import BitFlip, FaultInjector, Ledger, read_ledger
from tests.torch._models import global_batches, make_model

BACKENDS = (TORCH_NATIVE, MEGATRON, MEGATRON_BRIDGE)
KEYWORDS = train_keywords()


def _megatron() -> Any:
    from mixle_parallel.executors.megatron.backend import MegatronBackend

    return MegatronBackend()


def _prepare(backend: str) -> Any:
    """The backend's ``prepare`` (megatron's is imported only when megatron-core is installed)."""
    if backend == TORCH_NATIVE:
        return TorchDistributedBackend().prepare
    if backend == MEGATRON:
        pytest.importorskip("megatron.core", reason="the megatron extra (megatron-core) is not installed")
        return _megatron().prepare
    return MegatronBridgeBackend().prepare


def test_the_walk_covers_every_field_of_the_options_objects() -> None:
    import attrs

    fields = {f.name for f in attrs.fields(TrainOptions)} - {"audit"}
    audit = {"audit", "audit_rate", "audit_policy", "audit_bound", "audit_replay", "fault_injector"}
    assert set(KEYWORDS) == fields | audit
    assert len(attrs.fields(AuditOptions)) == len(audit)  # every AuditOptions field has its keyword
    assert all(KEYWORDS[k] for k in KEYWORDS)  # every option is honoured somewhere


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unknown_keyword_is_refused_naming_it(backend: str) -> None:
    with pytest.raises(TypeError, match="unknown option.*totally_bogus_option"):
        _prepare(backend)(torch.nn.Linear(2, 2), plan=ParallelPlan(), totally_bogus_option=123)
    assert not dist.is_initialized()


@pytest.mark.parametrize("backend,option", [(b, k) for b in BACKENDS for k in sorted(KEYWORDS)
                                            if b not in KEYWORDS[k]])
def test_an_option_of_another_backend_is_refused_naming_who_honours_it(backend: str, option: str) -> None:
    with pytest.raises(ValueError) as info:
        _prepare(backend)(torch.nn.Linear(2, 2), plan=ParallelPlan(), **{option: None})
    text = str(info.value)
    assert f"option {option}= is not honoured by the {backend!r} backend" in text
    assert all(repr(other) in text for other in KEYWORDS[option])
    assert not dist.is_initialized()


def test_session_methods_refuse_unknown_and_unhonoured_keywords(tmp_path: Any) -> None:
    session = TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(), optimizer="SGD", lr=0.1,
                                                health=False, audit=False)
    with pytest.raises(TypeError, match="bogus"):
        session.save_checkpoint(str(tmp_path / "c"), bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        session.load_checkpoint(str(tmp_path / "c"), bogus=1)
    session.close()
    pytest.importorskip("megatron.core", reason="the megatron extra (megatron-core) is not installed")
    from mixle_parallel.executors.megatron.session import LOAD_OPTIONS, SAVE_OPTIONS, MegatronSession

    bare = object.__new__(MegatronSession)  # the refusal comes before the session is used
    for method, options in (("save_checkpoint", SAVE_OPTIONS), ("load_checkpoint", LOAD_OPTIONS)):
        with pytest.raises(TypeError, match="bogus"):
            getattr(bare, method)("p", bogus=1)
        for option in options:
            with pytest.raises(ValueError, match=f"option {option}= of {method}.*'megatron'.*'torch_native'"):
                getattr(bare, method)("p", **{option: None})


def test_the_session_takes_options_objects_and_refuses_disagreements() -> None:
    from mixle_parallel.executors.torch.backend import CAPABILITIES

    module = make_model()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    common = dict(plan=ParallelPlan(), capabilities=CAPABILITIES, mesh=None, device="cpu", optimizer=opt,
                  optimizer_receipt={"name": "SGD"}, parameter_layouts=())
    with pytest.raises(ValueError, match=r"precision='fp32' but options.precision='bf16'"):
        TorchDistributedSession(module, precision="fp32", max_grad_norm=None, options=TrainOptions(precision="bf16"),
                                **common)
    with pytest.raises(ValueError, match="manual_data_parallel=True is not honoured"):
        TorchDistributedSession(module, precision="fp32", max_grad_norm=None, manual_data_parallel=True, **common)
    session = TorchDistributedSession(module, precision="fp32", max_grad_norm=1.0, **common,
                                      options=TrainOptions(health=False, audit=AuditOptions(mode=AuditMode.OFF)))
    x, y = global_batches(1, [4])[0][0]
    assert session.train_batch(x, y).step == 1 and session.audit_records == ()
    session.close()


@pytest.mark.parametrize("keywords,error,text", [
    ({"lr": 0}, ValueError, "lr=0 must be > 0"),
    ({"lr": "1e-3"}, TypeError, "lr must be a number"),
    ({"max_grad_norm": -1}, ValueError, "max_grad_norm=-1 must be > 0"),
    ({"seed": 1.5}, ValueError, "seed must be an int >= 0"),
    ({"nonfinite": "ignore"}, ValueError, "nonfinite='ignore' is not one of 'raise', 'skip'"),
    ({"audit": "sometimes"}, ValueError, "audit='sometimes'"),
    ({"audit_rate": 1.5}, ValueError, r"audit_rate=1.5 must be within \[0, 1\]"),
    ({"audit_policy": "quarantine"}, ValueError, "audit_policy='quarantine' is not one of 'warn', 'raise'"),
    ({"audit_bound": -1.0}, ValueError, "audit_bound=-1.0 must be >= 0"),
    ({"audit_replay": "never"}, ValueError, "audit_replay='never' is not one of 'peer', 'both'"),
    ({"fault_injector": object()}, TypeError, "fault_injector must be a verification.FaultInjector"),
    ({"ledger": 3}, TypeError, "ledger must be a path, a verification.Ledger or None"),
    ({"health": {"heartbeats": False}}, ValueError, r"unknown health options \['heartbeats'\]"),
    ({"tp_plan": ["blocks.*"]}, TypeError, "tp_plan must be a mapping"),
    ({"loss_fn": "mse"}, TypeError, "loss_fn must be callable"),
    ({"precision": 16}, TypeError, "precision must be a string"),
    ({"audit": AuditOptions(), "audit_rate": 0.5}, ValueError, "audit=AuditOptions.* or as audit_\\* keywords"),
])
def test_options_are_validated_at_the_edge_naming_the_option(keywords: dict, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(dp_shard=2), **keywords)
    assert not dist.is_initialized()


def test_options_objects_are_frozen_values() -> None:
    options = TrainOptions.from_keywords(TORCH_NATIVE, {"audit_rate": 0.5, "audit": True, "health": False, "seed": 3})
    assert options.audit == AuditOptions(mode=AuditMode.ON, rate=0.5) and options.health is None and options.seed == 3
    assert TrainOptions.from_keywords(TORCH_NATIVE, {"health": {"window": 7}}).health == HealthOptions(window=7)
    with pytest.raises(AttributeError):
        options.lr = 1.0  # type: ignore[misc]


def test_a_ledger_path_is_checked_before_the_process_group_and_works(tmp_path: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The old bug: prepare(ledger="run/ledger.jsonl") failed with AttributeError after the process group existed."""
    path = tmp_path / "run" / "ledger.jsonl"
    session = TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(), optimizer="SGD", lr=0.1,
                                                ledger=str(path), health=False)
    x, y = global_batches(1, [4])[0][0]
    session.train_batch(x, y)
    session.close()
    kinds = [e.kind for e in read_ledger(path).entries]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and "receipt" in kinds
    # a Ledger object on a rank other than 0 is refused before any process group exists
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match="rank 0 owns a training run's ledger, and rank 1 was given a Ledger"):
        TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(dp_replicate=2), admission="unverified",
                                          ledger=Ledger(tmp_path / "other.jsonl"))
    assert not dist.is_initialized()


def test_a_fault_injector_is_honoured_with_the_audit_off() -> None:
    """Before, fault_injector was dropped when the audit was off: here a parameter and a gradient flip strike."""
    batches = global_batches(3, [4], seed=5)

    def run(injector: Any) -> dict[str, torch.Tensor]:
        s = TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(), optimizer="SGD", lr=0.1,
                                              audit=False, health=False, fault_injector=injector)
        for b in batches:
            s.train_batch(*b[0])
        s.close()
        return {n: p.detach().clone() for n, p in s.module.named_parameters()}

    clean = run(None)
    for flip in (BitFlip("gradient", "blocks.0.up.weight", rank=0, step=1, index=3, bit=20),
                 BitFlip("parameter", "head.weight", rank=0, step=2, index=1, bit=20)):
        injector = FaultInjector([flip])
        struck = run(injector)
        assert injector.applied == (flip,)
        assert not torch.equal(struck[flip.name], clean[flip.name])


def test_streaming_tokens_builds_the_session_options_at_once() -> None:
    ids = np.arange(64) % 7
    with pytest.raises(TypeError, match="bogus"):
        StreamingTokenEncodedData(ids, block=4, batch_size=2, bogus=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unknown option.*bogus"):
        StreamingTokenEncodedData(ids, block=4, batch_size=2, session_options={"bogus": 1})
    with pytest.raises(ValueError, match="option activation_shape= is not honoured by the 'torch_native' backend"):
        StreamingTokenEncodedData(ids, block=4, batch_size=2, session_options={"activation_shape": (4,)})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['lr'\] for this handle: it sets them itself"):
        StreamingTokenEncodedData(ids, block=4, batch_size=2, session_options={"lr": 0.1})
    with pytest.raises(ValueError, match="audit_rate=2"):
        StreamingTokenEncodedData(ids, block=4, batch_size=2, session_options={"audit_rate": 2})


def test_megatron_bridge_keeps_its_own_options() -> None:
    backend = MegatronBridgeBackend()
    backend._require_bridge = lambda: object()  # type: ignore[method-assign]  # stands in for Bridge

    class Provider:
        bf16 = fp16 = False

        def provide_distributed_model(self, **kwargs: Any) -> Any:
            return types.SimpleNamespace(kwargs=kwargs)

    session = backend.prepare(Provider(), plan=ParallelPlan(tp=2), wrap_with_ddp=False, precision="BF16",
                              admission="unverified")
    assert session.module.kwargs == {"wrap_with_ddp": False} and session.precision == "bf16"


@pytest.mark.parametrize("setting", [{"audit_rate": 0.5}, {"audit_policy": "raise"}, {"audit_replay": "both"},
                                     {"audit_bound": 1e-3}, {"audit_rate": 0.05, "audit_bound": 0.0}])
def test_audit_settings_with_the_audit_off_are_refused_by_name(setting: dict) -> None:
    """As EM's handle refuses audit=False with audit_rate= (issue 34 item 8): a setting of an audit that is off."""
    names = "=, ".join(sorted(setting)) + "="
    with pytest.raises(ValueError, match=f"audit=False turns the SDC audit off, which contradicts {names}"):
        TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(dp_shard=2), audit=False, **setting)
    with pytest.raises(ValueError, match="contradicts audit_rate="):
        AuditOptions(mode=AuditMode.OFF, rate=0.5)
    assert not dist.is_initialized()
    AuditOptions(mode=AuditMode.OFF, fault_injector=FaultInjector([]))  # a fault injector stays: it shows the gap
