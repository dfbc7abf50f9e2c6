"""MegatronBridgeBackend: a ParallelPlan mapped onto an NVIDIA Megatron Bridge model provider (mixle's shape).

Megatron Bridge owns the transformer partitioner and, through ``run_pretrain``, the training loop;
this backend writes the plan into the provider (``configure_provider``) and the distributed
optimizer settings into the DDP config, then asks the provider for its distributed model. Nothing
is imported until a method needs Bridge; without it the error names the ``megatron-bridge`` extra.
For megatron-core itself (pipeline, tensor, data and expert parallel on CPU or GPU) use
``MegatronBackend`` (registered as ``megatron``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ...contracts import BackendCapabilities, MissingExtraError, ParallelAxis, ParallelPlan, StepReceipt
from ..training_options import MEGATRON_BRIDGE, TrainOptions

BRIDGE_CAPABILITIES = BackendCapabilities(
    name="megatron_bridge",
    axes=frozenset(ParallelAxis),
    precisions=frozenset({"fp32", "fp16", "bf16", "fp8"}),
    distributed_optimizer=True,
    reshardable_checkpoint=True,
    requirements=("megatron-bridge", "CUDA", "NCCL"),
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
                 precision: str = "bf16") -> None:
        self.module, self.plan, self.capabilities = model, plan, capabilities
        self.train_batch_fn, self.optimizer, self.precision = train_batch_fn, optimizer, precision
        self.step = 0

    def train_batch(self, inputs: Any, targets: Any) -> StepReceipt:
        """One step through ``train_batch_fn``: its StepReceipt, or a receipt built from the loss it returns."""
        if self.train_batch_fn is None:
            raise RuntimeError(
                "Megatron Bridge owns its training loop: call backend.run_pretrain(config, forward_step), or pass "
                "train_batch_fn=fn(model, optimizer, inputs, targets) -> loss to prepare()"
            )
        result = self.train_batch_fn(self.module, self.optimizer, inputs, targets)
        if isinstance(result, StepReceipt):
            self.step = max(self.step, result.step)
            return result
        self.step += 1
        shape = tuple(getattr(targets, "shape", ()))
        return StepReceipt(
            step=self.step, loss=float(result), local_examples=int(shape[0]) if shape else 0,
            local_tokens=int(getattr(targets, "numel", lambda: 0)()), microbatches=self.plan.microbatches,
            accumulation_steps=self.plan.gradient_accumulation_steps,
            data_parallel_size=self.plan.data_parallel_size, optimizer="megatron_distributed_optimizer",
            precision=self.precision, extra={"backend": "megatron_bridge"},
        )

    def finish_accumulation(self) -> StepReceipt | None:
        """Bridge keeps its own accumulation clock: nothing is pending here."""
        return None

    def discard_accumulation(self) -> StepReceipt | None:
        """Bridge keeps its own accumulation clock: nothing is pending here."""
        return None

    def close(self) -> None:
        """Nothing to release: Bridge owns the process groups."""


class MegatronBridgeBackend:
    """Map a ParallelPlan onto a Megatron Bridge model provider and its distributed optimizer config."""

    name = MEGATRON_BRIDGE
    capabilities = BRIDGE_CAPABILITIES

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
        ``precision`` (bf16 by default), ``ddp_config``, ``wrap_with_ddp``, ``train_batch_fn`` and ``optimizer``
        (handed to ``train_batch_fn``); any other is refused, naming the backends that honour it.
        """
        opts = TrainOptions.from_keywords(MEGATRON_BRIDGE, options)
        precision = opts.precision or "bf16"
        self.capabilities.validate(plan, precision=precision)
        self._require_bridge()
        provider = self.configure_provider(module, plan)
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
                                     precision=precision)

    def run_pretrain(self, config: Any, forward_step: Callable[..., Any], *, plan: ParallelPlan | None = None) -> Any:
        """Configure ``config.model``/``config.ddp`` for ``plan`` (when given) and run Bridge's ``pretrain``."""
        if plan is not None:
            self.capabilities.validate(plan)
            model = getattr(config, "model", None)
            if model is not None:
                self.configure_provider(model, plan)
            self.configure_distributed_optimizer(getattr(config, "ddp", None), plan)
        self._require_bridge()
        return importlib.import_module("megatron.bridge.training.pretrain").pretrain(config, forward_step)
