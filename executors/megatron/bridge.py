"""MegatronBridgeBackend: a ParallelPlan mapped onto an NVIDIA Megatron Bridge model provider (mixle's shape).

Megatron Bridge owns the transformer partitioner and, through ``run_pretrain``, the training loop;
this backend writes the plan into the provider (``configure_provider``) and the distributed
optimizer settings into the DDP config, then asks the provider for its distributed model. Nothing
is imported until a method needs Bridge; without it the error names the ``megatron-bridge`` extra.
For megatron-core itself (pipeline, tensor, data and expert parallel on CPU or GPU) use
``MegatronBackend`` (registered as ``megatron``).

``prepare`` and ``run_pretrain`` pass the admission gate (``admit_training``) before Bridge is asked
for anything. No harness target measures Bridge, so on a real mesh (more than one rank, or a GPU) it
runs with a certificate passed in, or with ``admission="unverified"`` (recorded in every receipt).
``BRIDGE_CAPABILITIES`` claims only what tests here drive (docs/megatron.md, "Megatron Bridge").
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import attrs

from ...contracts import (
    BackendCapabilities,
    DistributedUpdate,
    MissingExtraError,
    NotAdmittedError,
    ParallelAxis,
    ParallelPlan,
    StepReceipt,
)
from ...verification.admission import AdmissionDecision
from ..training_admission import admit_training
from ..training_options import MEGATRON_BRIDGE, TrainOptions
from .parallel_state import describe_megatron_updates

A = ParallelAxis
BRIDGE_CAPABILITIES = BackendCapabilities(
    name="megatron_bridge",
    # What tests here drive through prepare()/run_pretrain() into a provider with megatron-core's field
    # names: every physical and expert axis. Bridge itself never ran here (it needs CUDA-only packages).
    axes=frozenset({A.DP_REPLICATE, A.DP_SHARD, A.TP, A.PP, A.CP, A.EP, A.ETP}),
    # the precisions written into the provider (its bf16/fp16 flags); fp8 needs Transformer Engine
    # recipes that nothing here writes or runs, so it is not claimed
    precisions=frozenset({"fp32", "fp16", "bf16"}),
    distributed_optimizer=True,
    # Bridge's checkpoints are its own (run_pretrain); nothing here saves or reshards one
    reshardable_checkpoint=False,
    requirements=("megatron-bridge", "CUDA", "NCCL"),
    # Bridge's distributed optimizer shards over the whole data-parallel group: a plan asking to replicate
    # over dp_replicate while sharding over dp_shard (HSDP) would run as sharding over both
    incompatible_axis_sets=(frozenset({A.DP_REPLICATE, A.DP_SHARD}),),
)


def require_bridge() -> Any:
    """The ``megatron.bridge`` module; MissingExtraError naming the ``megatron-bridge`` extra without it."""
    try:
        return importlib.import_module("megatron.bridge")
    except ImportError as err:
        raise MissingExtraError("megatron-bridge (megatron.bridge)", "megatron-bridge") from err


class MegatronBridgeSession:
    """A Bridge-built distributed model driven by a caller's ``train_batch_fn(model, optimizer, x, y)``.

    Normal pretraining goes through ``MegatronBridgeBackend.run_pretrain``; this session exists for
    specialized loops and never substitutes a local step of its own.
    """

    def __init__(self, model: Any, *, plan: ParallelPlan, capabilities: BackendCapabilities,
                 train_batch_fn: Callable[..., Any] | None = None, optimizer: Any = None,
                 precision: str = "bf16", admission: AdmissionDecision | None = None) -> None:
        self.module, self.plan, self.capabilities = model, plan, capabilities
        self.train_batch_fn, self.optimizer, self.precision = train_batch_fn, optimizer, precision
        self.admission = admission
        self.step = 0

    def train_batch(self, inputs: Any, targets: Any) -> StepReceipt:
        """One step through ``train_batch_fn``: its StepReceipt, or a receipt built from the loss it returns."""
        if self.train_batch_fn is None:
            raise RuntimeError(
                "Megatron Bridge owns its training loop: call backend.run_pretrain(config, forward_step), or pass "
                "train_batch_fn=fn(model, optimizer, inputs, targets) -> loss to prepare()"
            )
        result = self.train_batch_fn(self.module, self.optimizer, inputs, targets)
        admitted = self.admission.receipt_extra() if self.admission is not None else {}
        if isinstance(result, StepReceipt):
            self.step = max(self.step, result.step)
            return attrs.evolve(result, extra={**result.extra, **admitted})
        self.step += 1
        shape = tuple(getattr(targets, "shape", ()))
        return StepReceipt(
            step=self.step, loss=float(result), local_examples=int(shape[0]) if shape else 0,
            local_tokens=int(getattr(targets, "numel", lambda: 0)()), microbatches=self.plan.microbatches,
            accumulation_steps=self.plan.gradient_accumulation_steps,
            data_parallel_size=self.plan.data_parallel_size, optimizer="megatron_distributed_optimizer",
            precision=self.precision, extra={"backend": "megatron_bridge", **admitted},
        )

    def finish_accumulation(self) -> StepReceipt | None:
        """Bridge keeps its own accumulation clock: nothing is pending here."""
        return None

    def discard_accumulation(self) -> StepReceipt | None:
        """Bridge keeps its own accumulation clock: nothing is pending here."""
        return None

    def close(self) -> None:
        """Nothing to release: Bridge owns the process groups."""


_NO_HARNESS = ("megatron_bridge has no verification target here (mixle-parallel certify cannot measure Bridge): "
               "pass certificate= signed where Bridge was measured, or admission='unverified' (recorded in every "
               "receipt); for a certifiable megatron-core run use the 'megatron' backend")


def _device_kind() -> str:
    """Where Bridge runs: ``cuda`` when torch sees a GPU, else ``cpu`` (torch imported only if already loaded
    or installed; Bridge itself needs CUDA)."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def plan_of_config(config: Any) -> ParallelPlan:
    """The plan a Bridge training config runs: the provider's parallel sizes and ``WORLD_SIZE`` ranks, the rest
    data parallel (sharded when ``config.ddp.use_distributed_optimizer``)."""
    model = getattr(config, "model", None)
    sizes = {axis: int(getattr(model, field, 1) or 1) for axis, field in (
        ("tp", "tensor_model_parallel_size"), ("pp", "pipeline_model_parallel_size"),
        ("cp", "context_parallel_size"), ("ep", "expert_model_parallel_size"),
        ("etp", "expert_tensor_parallel_size"))}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model_ranks = sizes["tp"] * sizes["pp"] * sizes["cp"]
    if world % model_ranks:
        raise ValueError(f"WORLD_SIZE={world} is not a multiple of tp*pp*cp={model_ranks} of config.model; pass "
                         "plan= to run_pretrain or launch tp*pp*cp*data-parallel ranks")
    sharded = bool(getattr(getattr(config, "ddp", None), "use_distributed_optimizer", False))
    dp = {"dp_shard" if sharded else "dp_replicate": world // model_ranks}
    return ParallelPlan(**dp, **sizes)


class MegatronBridgeBackend:
    """Map a ParallelPlan onto a Megatron Bridge model provider and its distributed optimizer config."""

    name = MEGATRON_BRIDGE
    capabilities = BRIDGE_CAPABILITIES
    certified_libraries = ("megatron-bridge", "megatron-core")
    """Distributions beyond python/numpy/torch whose versions a certificate binds."""

    @property
    def version(self) -> str:
        """This executor's identity for certificates: mixle-parallel and the installed Bridge."""
        try:
            bridge = importlib.metadata.version("megatron-bridge")
        except importlib.metadata.PackageNotFoundError:
            bridge = "absent"
        return f"{importlib.metadata.version('mixle-parallel')}+megatron-bridge-{bridge}"

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        """megatron-core's communication for ``plan`` (Bridge builds megatron-core models), sharded over dp_shard."""
        self.capabilities.validate(plan)
        return describe_megatron_updates(plan, sharded_data_parallel=plan.dp_shard > 1)

    def admit(self, plan: ParallelPlan, precision: str, *, certificate: Any = None,
              admission: Any = None) -> AdmissionDecision:
        """The admission gate for ``plan`` at ``precision`` on this machine's device, before Bridge builds anything.

        No harness target measures Bridge, so a refusal names the two ways in instead of a certify command.
        """
        try:
            return admit_training(self, plan, precision, certificate=certificate, admission=admission,
                                  device=_device_kind())
        except NotAdmittedError as exc:
            reasons = [r for r in exc.reasons if not r.startswith("run `mixle-parallel certify")]
            raise NotAdmittedError((*reasons, _NO_HARNESS)) from None

    def _require_bridge(self) -> Any:
        """The ``megatron.bridge`` module (mixle 0.8.2's hook name; a test may replace it on the instance)."""
        return require_bridge()

    @staticmethod
    def configure_provider(provider: Any, plan: ParallelPlan) -> Any:
        """Write the plan's model-parallel sizes into a mutable Bridge model provider; returns the provider."""
        if not isinstance(plan, ParallelPlan):
            raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
        values = {
            "tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
            "context_parallel_size": plan.cp, "expert_model_parallel_size": plan.ep,
            "expert_tensor_parallel_size": plan.etp, "sequence_parallel": plan.tp > 1,
        }
        for name, value in values.items():
            setattr(provider, name, value)
        return provider

    @staticmethod
    def configure_precision(provider: Any, precision: str) -> Any:
        """Write ``precision`` into the provider's megatron-core flags (``bf16``, ``fp16``; both off for fp32)."""
        missing = [flag for flag in ("bf16", "fp16") if not hasattr(provider, flag)]
        if missing:
            raise TypeError(f"{type(provider).__name__} has no {' or '.join(missing)} attribute, so precision="
                            f"{precision!r} cannot be applied; pass a Bridge model provider (megatron-core config)")
        provider.bf16, provider.fp16 = precision == "bf16", precision == "fp16"
        return provider

    @staticmethod
    def configure_distributed_optimizer(config: Any, plan: ParallelPlan) -> Any:
        """Shard optimizer state over dp_shard and overlap the reductions on a Bridge DDP config (None passes)."""
        if config is None:
            return None
        values = {"use_distributed_optimizer": plan.dp_shard > 1, "overlap_grad_reduce": True,
                  "overlap_param_gather": plan.dp_shard > 1}
        for name, value in values.items():
            if hasattr(config, name):
                setattr(config, name, value)
        return config

    def prepare(self, module: Any, *, plan: ParallelPlan, **options: Any) -> MegatronBridgeSession:
        """Configure the provider ``module`` for ``plan``, finalize it and build its distributed model.

        mixle's signature: the keywords become a ``TrainOptions`` at once; megatron_bridge honours
        ``precision`` (bf16 by default; written into the provider), ``ddp_config``, ``wrap_with_ddp``,
        ``train_batch_fn``, ``optimizer`` (handed to ``train_batch_fn``), ``admission`` and ``certificate``
        (the gate, before Bridge is touched); any other is refused, naming the backends that honour it.
        """
        opts = TrainOptions.from_keywords(MEGATRON_BRIDGE, options)
        precision = opts.precision or "bf16"
        self.capabilities.validate(plan, precision=precision)
        admitted = self.admit(plan, precision, certificate=opts.certificate, admission=opts.admission)
        self._require_bridge()
        provider = self.configure_precision(self.configure_provider(module, plan), precision)
        ddp_config = self.configure_distributed_optimizer(opts.ddp_config, plan)
        finalize = getattr(provider, "finalize", None)
        model_config = finalize() if callable(finalize) else provider
        provide = getattr(provider, "provide_distributed_model", None)
        if not callable(provide):
            provide = getattr(model_config, "provide_distributed_model", None)
        if not callable(provide):
            raise TypeError(
                f"{type(provider).__name__} is not a Megatron Bridge model provider: it has no "
                "provide_distributed_model(); pass a provider such as megatron.bridge's GPTModelProvider"
            )
        kwargs: dict[str, Any] = {"wrap_with_ddp": opts.wrap_with_ddp}
        if ddp_config is not None:
            kwargs["ddp_config"] = ddp_config
        return MegatronBridgeSession(provide(**kwargs), plan=plan, capabilities=self.capabilities,
                                     train_batch_fn=opts.train_batch_fn, optimizer=opts.optimizer,
                                     precision=precision, admission=admitted)

    def run_pretrain(self, config: Any, forward_step: Callable[..., Any], *, plan: ParallelPlan | None = None,
                     admission: Any = None, certificate: Any = None) -> Any:
        """Configure ``config.model``/``config.ddp`` for ``plan`` (when given) and run Bridge's ``pretrain``.

        The plan (without one: :func:`plan_of_config`, what the config will run) passes the gate first,
        with ``admission``/``certificate`` as in ``prepare``.
        """
        if plan is not None:
            self.capabilities.validate(plan)
            model = getattr(config, "model", None)
            if model is not None:
                self.configure_provider(model, plan)
            self.configure_distributed_optimizer(getattr(config, "ddp", None), plan)
        checked = plan if plan is not None else plan_of_config(config)
        self.capabilities.validate(checked)
        self.admit(checked, "bf16" if getattr(getattr(config, "model", None), "bf16", True) else "fp32",
                   certificate=certificate, admission=admission)
        self._require_bridge()
        return importlib.import_module("megatron.bridge.training.pretrain").pretrain(config, forward_step)
