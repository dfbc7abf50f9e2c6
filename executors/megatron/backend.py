"""MegatronBackend: prepares a megatron-core session (pipeline, tensor, data and expert parallel).

``prepare(module, plan=...)`` initializes megatron's ``parallel_state`` from the plan in the
running world, builds this rank's pipeline stage, wraps it in megatron's DDP and builds a
megatron optimizer. ``module`` is an ``nn.Sequential`` (identical on every rank; it is cut into
``pp`` contiguous stages) or a callable ``build(config) -> nn.Sequential`` called after the
parallel state exists, so it can use megatron's tensor-parallel layers and MoE layers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import attrs
import torch
import torch.distributed as dist

from ...contracts import (
    BackendCapabilities,
    DistributedUpdate,
    ParallelAxis,
    ParallelPlan,
    WorkerTopologyAttestation,
    attest_worker_coordinate,
)
from ...verification.in_situ import ProbeOutcome
from ..torch.health import SessionHealth
from ..torch.probe_gate import probe_not_run
from ..training_admission import admit_training
from ..training_in_situ import in_situ_certifier
from ..training_options import MEGATRON, TrainOptions
from .cpu_compat import cpu_compat
from .parallel_state import (
    check_layout,
    describe_megatron_updates,
    initialize_parallel_state,
    megatron_live_coordinate,
)
from .session import LossFn, MegatronSession
from .stages import PipelineStage, stage_bounds, transport_shape

BACKEND_NAME = MEGATRON

MEGATRON_PROBE_SKIPPED = (
    "megatron rebuilds the module as tensor/pipeline-parallel stages; a one-rank recomputation of the user's module "
    "through megatron is not implemented, so only the harness's reference workload was measured on these ranks")
"""Why an in-situ certificate of megatron records the probe of the user's module as skipped."""
OPTIMIZERS = ("adam", "sgd")


def megatron_version() -> str:
    """The installed megatron-core version."""
    from megatron.core import __version__

    return str(__version__)


def _capabilities(sharded_data_parallel: bool) -> BackendCapabilities:
    axes = {ParallelAxis.DP_REPLICATE, ParallelAxis.PP, ParallelAxis.TP, ParallelAxis.EP}
    if sharded_data_parallel:
        axes.add(ParallelAxis.DP_SHARD)
    return BackendCapabilities(
        name=BACKEND_NAME,
        axes=frozenset(axes),
        precisions=frozenset({"fp32"}),
        distributed_optimizer=sharded_data_parallel,
        reshardable_checkpoint=True,
        requirements=("megatron-core>=0.16", "torch>=2.6"),
    )


class MegatronBackend:
    """Training backend running megatron-core's schedules, DDP and optimizers.

    ``sharded_data_parallel=True`` opts in to megatron's distributed optimizer for ``dp_shard``;
    it needs CUDA (see docs/megatron.md) and is checked by tests/device, so the default backend
    does not claim it.
    """

    certified_libraries = ("megatron-core",)
    """Distributions beyond python/numpy/torch whose versions a certificate binds."""

    def __init__(self, *, sharded_data_parallel: bool = False) -> None:
        self.sharded_data_parallel = bool(sharded_data_parallel)
        self._capabilities = _capabilities(self.sharded_data_parallel)

    @property
    def capabilities(self) -> BackendCapabilities:
        """The axes, precision and features this backend executes and has tests for."""
        return self._capabilities

    @property
    def version(self) -> str:
        """This executor's identity for certificates: backend and megatron-core versions."""
        from importlib.metadata import version

        return f"{version('mixle-parallel')}+megatron-core-{megatron_version()}"

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        """Every communication this backend performs for ``plan``."""
        self.validate(plan)
        return describe_megatron_updates(plan, sharded_data_parallel=self.sharded_data_parallel)

    def validate(self, plan: ParallelPlan, precision: str = "fp32") -> None:
        """Reject, before any process group is touched, a plan this backend cannot run as planned."""
        self.capabilities.validate(plan, precision)
        check_layout(plan)

    def prepare(self, module: torch.nn.Sequential | Callable[[Any], torch.nn.Sequential], *, plan: ParallelPlan,
                **options: Any) -> MegatronSession:
        """Build megatron's parallel state, this rank's stage, DDP and optimizer; return the session.

        mixle's signature: the keywords become a ``TrainOptions`` at once (an unknown one is refused, and
        so is one only other backends honour, naming them). megatron honours ``loss_fn`` (required:
        ``loss(output, target)``, a microbatch's mean loss), ``activation_shape`` (required: one example's
        activation at a stage boundary, ``(hidden,)`` or ``(seq, hidden)``), ``optimizer`` (``"adam"``, the
        default, or ``"sgd"``), ``lr``, ``weight_decay``, ``sgd_momentum``, ``max_grad_norm`` (CUDA only),
        ``stage_boundaries``, ``precision``, ``device``, ``seed`` (torch's RNG: before a builder runs, and for
        what the training draws, such as dropout masks, whatever the module), ``moe_config``,
        ``certificate``/``admission`` and ``health`` (MFU needs its ``flop_config`` here). A world larger than
        one rank needs a certificate or ``admission="unverified"``.
        """
        opts = TrainOptions.from_keywords(BACKEND_NAME, options)
        precision = opts.precision or "fp32"
        self.validate(plan, precision)
        opts, device = _check_options(opts)
        admitted = admit_training(self, plan, precision, certificate=opts.certificate, admission=opts.admission,
                                  device=device, auto_certify=in_situ_certifier(
                                      BACKEND_NAME, plan, precision, device=device, ensure_group=lambda: None,
                                      probe=lambda: ProbeOutcome("skipped", MEGATRON_PROBE_SKIPPED)))
        admitted = probe_not_run(admitted, plan, MEGATRON_PROBE_SKIPPED)  # in every receipt, and logged first
        rank, world = dist.get_rank(), dist.get_world_size()
        attestation = attest_worker_coordinate(plan, actual_world_size=world, rank=rank)
        with cpu_compat(device):
            stage, model, optimizer = self._build(module, plan, opts, device, attestation)
        session = MegatronSession(
            model=model, stage=stage, optimizer=optimizer, plan=plan, capabilities=self.capabilities,
            loss_fn=cast(LossFn, opts.loss_fn), device=device, precision=precision,
            optimizer_name=f"megatron-{opts.optimizer}", admission=admitted, attestation=attestation,
            health=None if opts.health is None else SessionHealth(
                opts.health, module=None, device=device, rank=rank, world_size=world))
        if opts.seed is not None:  # last: what the training draws (dropout) follows the seed, whatever was built
            torch.manual_seed(opts.seed)
        return session

    # ---- steps of prepare ------------------------------------------------------------
    def _build(self, module: Any, plan: ParallelPlan, opts: TrainOptions, device: torch.device,
               attestation: WorkerTopologyAttestation) -> tuple[PipelineStage, Any, Any]:
        """megatron's parallel state (checked against the plan's rank layout), this rank's stage, DDP, optimizer."""
        initialize_parallel_state(plan, gloo_groups=True)
        coordinate = megatron_live_coordinate(plan)
        if coordinate != attestation.coordinate:
            raise RuntimeError(
                f"megatron placed rank {attestation.rank} at {coordinate.as_dict()}, the plan at "
                f"{attestation.coordinate.as_dict()}; refusing to train on a mismatched mesh"
            )
        assert opts.activation_shape is not None  # _check_options
        config = self._config(plan, opts.activation_shape, device, opts.moe_config)
        stage = self._build_stage(module, plan, config, coordinate.pp, opts, device)
        model, optimizer = self._wrap(stage, config, opts)
        return stage, model, optimizer

    def _config(
        self,
        plan: ParallelPlan,
        activation_shape: Sequence[int],
        device: torch.device,
        moe_config: Mapping[str, Any] | None,
    ) -> Any:
        from megatron.core.transformer import TransformerConfig

        _, hidden = transport_shape(tuple(activation_shape))
        extra = dict(moe_config or {})
        if plan.ep > 1 and not extra.get("num_moe_experts"):
            raise ValueError(f"ep={plan.ep} needs moe_config with num_moe_experts (a multiple of ep)")
        if extra.get("num_moe_experts") and device.type == "cpu":
            # The alltoall dispatcher allocates torch.cuda.Stream(); allgather runs on gloo.
            extra.setdefault("moe_token_dispatcher_type", "allgather")
        return TransformerConfig(
            num_layers=plan.pp,
            hidden_size=hidden,
            num_attention_heads=plan.tp,  # no attention; tp must divide it
            tensor_model_parallel_size=plan.tp,
            pipeline_model_parallel_size=plan.pp,
            context_parallel_size=plan.cp,
            expert_model_parallel_size=plan.ep,
            expert_tensor_parallel_size=plan.etp,
            use_cpu_initialization=device.type == "cpu",
            pipeline_dtype=torch.float32,
            params_dtype=torch.float32,
            **extra,
        )

    def _build_stage(self, module: Any, plan: ParallelPlan, config: Any, pp_rank: int, opts: TrainOptions,
                     device: torch.device) -> PipelineStage:
        """This rank's contiguous layers of the model: an ``nn.Sequential`` as it is, a builder called seeded
        (``seed``, or 0, so every rank builds the same weights)."""
        if isinstance(module, torch.nn.Sequential):
            layers = module
        elif callable(module):
            torch.manual_seed(0 if opts.seed is None else opts.seed)
            layers = module(config)
            if not isinstance(layers, torch.nn.Sequential):
                raise TypeError(f"the model builder returned {type(layers).__name__}; return an nn.Sequential")
        else:
            raise TypeError(
                f"module must be an nn.Sequential or a callable(config) -> nn.Sequential, got {type(module).__name__}"
            )
        assert opts.activation_shape is not None  # _check_options
        start, stop = stage_bounds(len(layers), plan.pp, opts.stage_boundaries)[pp_rank]
        mine = torch.nn.Sequential(*list(layers)[start:stop]).to(device)
        return PipelineStage(mine, config=config, stage=pp_rank, num_stages=plan.pp,
                             activation_shape=tuple(opts.activation_shape), first_layer_index=start)

    def _wrap(self, stage: PipelineStage, config: Any, opts: TrainOptions) -> tuple[Any, Any]:
        """megatron's DDP over the stage and its optimizer (distributed with ``sharded_data_parallel``)."""
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        sharded = self.sharded_data_parallel
        ddp = DistributedDataParallel(
            config,
            DistributedDataParallelConfig(use_distributed_optimizer=sharded, overlap_grad_reduce=False),
            stage,
        )
        opt = get_megatron_optimizer(
            OptimizerConfig(
                optimizer=opts.optimizer, lr=opts.lr, min_lr=opts.lr, weight_decay=opts.weight_decay,
                sgd_momentum=opts.sgd_momentum, clip_grad=float(opts.max_grad_norm or 0.0),
                use_distributed_optimizer=sharded, bf16=False, fp16=False, params_dtype=torch.float32,
            ),
            [ddp],
        )
        return ddp, opt


def _check_options(opts: TrainOptions) -> tuple[TrainOptions, torch.device]:
    """megatron's own checks of its options (after the plan's), before admission: the required ones, the
    optimizer's name (None: ``"adam"``), the running world, the device and what the CPU cannot run."""
    if opts.loss_fn is None:
        raise ValueError("megatron prepare() needs loss_fn=loss(output, target) -> a microbatch's mean loss")
    if opts.activation_shape is None:
        raise ValueError("megatron prepare() needs activation_shape=: one example's activation at a stage boundary, "
                         "(hidden,) or (seq, hidden)")
    optimizer = "adam" if opts.optimizer is None else opts.optimizer
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is not one of {OPTIMIZERS}")
    if not dist.is_initialized():
        raise RuntimeError(
            "MegatronBackend.prepare needs an initialized torch.distributed world; start the ranks "
            "with torchrun or a launcher from mixle_parallel.executors.launchers.base"
        )
    device = torch.device(opts.device) if opts.device is not None else torch.device(
        f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and opts.max_grad_norm:
        raise ValueError(
            "max_grad_norm needs CUDA with megatron-core: clip_grad_by_total_norm_fp32 asserts "
            "param.grad.type() == 'torch.cuda.FloatTensor'; leave max_grad_norm=None on the CPU"
        )
    return attrs.evolve(opts, optimizer=optimizer), device


def create_megatron_backend() -> MegatronBackend:
    """Lazy registry factory: importing this module imports torch and megatron-core."""
    return MegatronBackend()
