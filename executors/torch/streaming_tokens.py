"""StreamingTokenEncodedData (mixle's ``torch_neural``): SPMD next-token training on per-rank token shards.

Each rank keeps only its own contiguous slice of the corpus and trains the estimator's module through a
``torch_native`` session: gradients are all-reduced (DDP) or reduce-scattered (FSDP2) inside backward,
never gathered to a root, and every rank ends with the same parameters. The step schedule is global
(every rank runs the largest rank's batch count, padding with ignored targets), and each committed
gradient is the exact mean over all ranks' real targets. The session's StepReceipts are kept on the
handle (``receipts``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...contracts import ParallelPlan, StepReceipt, comm_backend_for
from ..estimation.em_pass.chunks import seed_from
from ..training_options import TORCH_NATIVE, TrainOptions
from .backend import TorchDistributedBackend
from .device_mesh import destroy_default_group
from .layouts import unwrap
from .losses import IGNORE_INDEX
from .token_windows import (
    exact_bool,
    exact_int,
    padded_batch,
    rank_window_schedule,
    shard_bounds,
    validate_token_ids,
    window_batches,
)

__all__ = ["StreamingTokenEncodedData", "TrainedTokenModel", "next_token_loss"]

PARALLEL_MODES = ("auto", "ddp", "fsdp", "none")
PRECISIONS = ("fp32", "bf16")
PG_BACKENDS = (None, "gloo", "nccl")
_HANDLE_SETS = frozenset({"loss_fn", "optimizer", "lr", "precision", "device", "admission", "tp_plan"})
"""``prepare()`` options the handle sets itself (``tp_plan``: it trains data-parallel only)."""


def next_token_loss(module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """Cross-entropy *sum* of ``module(contexts)`` (shaped ``(batch, vocab)``) against the next tokens, and
    the counted targets (padding targets equal to -100 are ignored)."""
    logits = module(inputs)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != targets.shape[0]:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(
            f"a streaming token module must map contexts shaped (batch, block) to next-token logits shaped "
            f"(batch, vocab) = ({targets.shape[0]}, vocab), got {shape}; return the last position's logits"
        )
    loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum", ignore_index=IGNORE_INDEX)
    return loss_sum, (targets != IGNORE_INDEX).sum()


@attrs.frozen
class TrainedTokenModel:
    """What ``pysp_seq_estimate`` returns for a non-mixle estimator: the trained module and its device."""

    module: nn.Module
    device: str
    lr: float


def _check_choice(value: Any, name: str, allowed: tuple[Any, ...]) -> Any:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; use one of {list(allowed)}")
    return value


def _check_model_axes(tp_size: Any, pp_size: Any, cp_size: Any) -> None:
    sizes = {name: exact_int(v, name, minimum=1) for name, v in
             (("tp_size", tp_size), ("pp_size", pp_size), ("cp_size", cp_size))}
    active = [f"{name}={v}" for name, v in sizes.items() if v > 1]
    if active:
        raise ValueError(
            f"StreamingTokenEncodedData trains data-parallel only, so {', '.join(active)} cannot run here; "
            "use TorchDistributedBackend().prepare(module, plan=ParallelPlan(tp=..., cp=...)) for tensor or "
            "context parallelism, or MegatronBackend for pipeline parallelism"
        )


def _check_session_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``session_options`` as ``prepare()`` would take them, checked at once by building their ``TrainOptions``."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"session_options must be a mapping of prepare() options, got {type(options).__name__}")
    set_here = sorted(set(options) & _HANDLE_SETS)
    if set_here:
        raise ValueError(f"session_options has unknown key(s) {set_here} for this handle: it sets them itself (the "
                         "estimator's module, lr and device, the next-token loss, AdamW, data parallelism only; "
                         "precision= and admission= are the handle's own arguments); leave them out")
    TrainOptions.from_keywords(TORCH_NATIVE, options)
    return dict(options)


def _estimator_module(estimator: Any) -> tuple[nn.Module, float, torch.device]:
    """The estimator's module, learning rate and device (mixle's StreamingTransformerEstimator shape)."""
    module = getattr(estimator, "module", None)
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"the estimator must carry a torch.nn.Module as .module (mixle's StreamingTransformerLeafEstimator "
            f"does), got {type(module).__name__} on {type(estimator).__name__}"
        )
    lr = getattr(estimator, "lr", 3e-3)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"the estimator's lr must be a finite number > 0, got {lr!r}")
    named = getattr(estimator, "device", "cpu")
    try:
        device = torch.device(named)
    except (TypeError, RuntimeError) as exc:
        raise ValueError(f"the estimator's device {named!r} is not a torch device") from exc
    return module, float(lr), device


def _start_module(module: nn.Module, prev_estimate: Any) -> nn.Module:
    """The module training starts from: ``prev_estimate``'s (a previous result), else the estimator's."""
    if prev_estimate is None:
        return module
    start = getattr(prev_estimate, "module", None)
    if not isinstance(start, nn.Module):
        raise TypeError(f"prev_estimate must carry a torch.nn.Module as .module (what pysp_seq_estimate and "
                        f"pysp_seq_initialize return), got {type(prev_estimate).__name__}; pass None to start "
                        "from the estimator's module")
    return start


def _redraw_parameters(module: nn.Module, seed: int) -> None:
    """Re-initialize every layer with ``reset_parameters`` from a torch generator seeded by ``seed``."""
    layers: list[Any] = [m for m in module.modules() if callable(getattr(m, "reset_parameters", None))]
    if not layers:
        raise ValueError(f"rng= draws the start through the layers' reset_parameters(), but {type(module).__name__} "
                         "has none; pass rng=None to start from the module's parameters as they are")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for layer in layers:
            layer.reset_parameters()


def _result_for(estimator: Any, module: nn.Module, device: torch.device, lr: float) -> Any:
    """mixle's StreamingTransformerLeaf for a mixle estimator, else a TrainedTokenModel."""
    if type(estimator).__module__.startswith("mixle."):
        from mixle.models.streaming_transformer_leaf import StreamingTransformerLeaf

        return StreamingTransformerLeaf(module, str(device), lr=lr)
    return TrainedTokenModel(module, str(device), lr)


class StreamingTokenEncodedData:
    """Per-rank streamed token shard; ``pysp_seq_estimate`` trains the module SPMD through torch_native.

    mixle 0.8.2's constructor: ``token_ids`` (1-D ids), ``block`` (context length), ``batch_size``
    (windows per rank and step), ``epochs``, ``shuffle``, ``shard_by_rank``, ``init_process_group``
    (create the group from the torchrun environment when none exists), ``backend`` (gloo/nccl),
    ``parallel`` (auto = FSDP2 on CUDA, DDP on CPU), ``precision``, ``activation_checkpointing``.
    Ours adds ``seed`` (epoch ``e`` shuffles with ``seed + e``), ``admission`` (the gate's opt-out or a
    certificate) and ``session_options`` (more ``prepare()`` options). Every argument is checked
    before a process group is created.
    """

    def __init__(
        self,
        token_ids: Any,
        *,
        block: int,
        batch_size: int,
        epochs: int = 1,
        shuffle: bool = True,
        shard_by_rank: bool = True,
        init_process_group: bool = True,
        backend: str | None = None,
        parallel: str = "auto",
        precision: str = "fp32",
        activation_checkpointing: bool = False,
        tp_size: int = 1,
        pp_size: int = 1,
        cp_size: int = 1,
        seed: int = 0,
        admission: Any = None,
        session_options: Mapping[str, Any] | None = None,
    ) -> None:
        ids = validate_token_ids(token_ids)
        self.block = exact_int(block, "block", minimum=1)
        self.batch_size = exact_int(batch_size, "batch_size", minimum=1)
        self.epochs = exact_int(epochs, "epochs", minimum=0)
        self.seed = exact_int(seed, "seed", minimum=0)
        self.shuffle = exact_bool(shuffle, "shuffle")
        self.shard_by_rank = exact_bool(shard_by_rank, "shard_by_rank")
        self.activation_checkpointing = exact_bool(activation_checkpointing, "activation_checkpointing")
        self.parallel = _check_choice(parallel, "parallel", PARALLEL_MODES)
        self.precision = _check_choice(precision, "precision", PRECISIONS)
        _check_choice(backend, "backend", PG_BACKENDS)
        _check_model_axes(tp_size, pp_size, cp_size)
        self.tp_size = self.pp_size = self.cp_size = 1
        self.admission = admission
        self._session_options = _check_session_options(session_options)
        if len(ids) <= self.block:
            raise ValueError(f"token_ids holds {len(ids)} tokens, so no window of block={self.block} tokens has a "
                             "next token; pass more tokens or a smaller block")
        init = exact_bool(init_process_group, "init_process_group")
        self.rank, self.world = _expected_rank_world(init)
        if self.parallel == "none" and self.world > 1:
            raise ValueError(f"parallel='none' on {self.world} ranks would train {self.world} diverging copies; "
                             "use parallel='auto', 'ddp' or 'fsdp'")
        self._schedule_for(ids)
        self._owns_pg = _maybe_init_process_group(init, backend)
        if self._owns_pg and (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world):
            self.close()
            raise RuntimeError(f"the process group placed this process at rank {dist.get_rank()} of "
                               f"{dist.get_world_size()}, but RANK/WORLD_SIZE say {self.rank} of {self.world}")
        self.receipts: tuple[StepReceipt, ...] = ()

    def _schedule_for(self, ids: np.ndarray) -> None:
        n_tokens = len(ids)
        sharded = self.shard_by_rank and self.world > 1
        start, stop = shard_bounds(n_tokens, self.world, self.rank) if sharded else (0, n_tokens)
        self._ids = ids[start:stop].copy()  # a copy: a view would keep the whole corpus resident
        self.schedule = rank_window_schedule(n_tokens, self.world, block=self.block, batch_size=self.batch_size,
                                             shard_by_rank=self.shard_by_rank)
        if self.schedule.steps_per_epoch == 0 and self.epochs:
            raise ValueError(f"no rank's shard holds more than block={self.block} tokens ({n_tokens} tokens over "
                             f"{self.world} ranks); pass more tokens, a smaller block or shard_by_rank=False")
        windows = self.schedule.window_counts
        self.steps_per_epoch = self.schedule.steps_per_epoch
        self.local_target_tokens = windows[self.rank]
        self.masked_target_tokens = (self.steps_per_epoch * self.batch_size - windows[self.rank]) * self.epochs
        excluded = max(0, n_tokens - self.block) - sum(windows) if self.shard_by_rank else 0
        self.excluded_target_tokens = max(0, excluded) * self.epochs
        self.schedule_receipt = {
            "world_size": self.world, "window_counts_by_rank": windows, "steps_per_epoch": self.steps_per_epoch,
            "epochs": self.epochs, "local_masked_target_tokens": self.masked_target_tokens,
            "global_real_target_tokens_per_epoch": sum(windows), "excluded_target_tokens": self.excluded_target_tokens,
            "policy": "pad-and-mask-to-global-max-steps",
        }

    @property
    def owns_process_group(self) -> bool:
        """True when this handle created the default process group (``close`` then destroys it)."""
        return self._owns_pg

    def plan(self) -> ParallelPlan:
        """The torch_native plan the session runs: DDP replicas or FSDP2 shards over every rank."""
        mode = self.parallel
        if mode == "auto":
            mode = "fsdp" if torch.cuda.is_available() and self.world > 1 else "ddp"
        if self.world == 1:
            return ParallelPlan()
        return ParallelPlan(dp_shard=self.world) if mode == "fsdp" else ParallelPlan(dp_replicate=self.world)

    def pysp_seq_estimate(self, estimator: Any, prev_estimate: Any) -> Any:
        """Train on every rank's shard for ``epochs`` from ``prev_estimate`` (its ``.module``; None: the
        estimator's module); returns the trained model (the estimator gives the learning rate and device).

        Each step every rank feeds one padded batch; the session all-reduces the gradients in backward
        and commits the exact global mean over real targets. ``self.receipts`` holds the step receipts.
        """
        module, lr, device = _estimator_module(estimator)
        module = _start_module(module, prev_estimate).to(device)
        if self.activation_checkpointing:
            _checkpoint_blocks(module)
        session = TorchDistributedBackend().prepare(
            module, plan=self.plan(), loss_fn=next_token_loss, optimizer="AdamW", lr=lr, precision=self.precision,
            device=device, admission=self.admission, **self._session_options)
        receipts: list[StepReceipt] = []
        try:
            for epoch in range(self.epochs):
                source = window_batches(self._ids, block=self.block, batch_size=self.batch_size,
                                        shuffle=self.shuffle, seed=self.seed + epoch)
                for _ in range(self.steps_per_epoch):
                    x, y = padded_batch(next(source, None), block=self.block, batch_size=self.batch_size,
                                        device=device)
                    receipts.append(session.train_batch(x, y))
        finally:
            session.close()
            self.receipts = tuple(receipts)
        return _result_for(estimator, unwrap(session.module), device, lr)

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any:
        """The estimator's module untrained (no distributed fitting), its parameters drawn from ``rng``.

        ``rng`` (a numpy RandomState or Generator, or an int) seeds its layers' ``reset_parameters()``, so a
        start is a function of ``rng`` on every rank; ``rng=None`` keeps the module's parameters as they are.
        ``p`` is checked as mixle's (no rows are subsampled to start a network).
        """
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {p!r}")
        module, lr, device = _estimator_module(estimator)
        if rng is not None:
            _redraw_parameters(module, seed_from(rng))
        return _result_for(estimator, module, device, lr)

    def pysp_seq_log_density_sum(self, estimate: Any) -> tuple[float, float]:
        """``(windows, summed next-token log probability)`` of ``estimate.module`` over the corpus.

        Collective: each rank scores its own windows in corpus order, every rank runs the same number of
        (padded) forwards, so an FSDP2 module's all-gathers line up, and one float64 all-reduce sums the
        shards (with ``shard_by_rank=False`` every rank already holds the whole corpus: no sum).
        """
        module = getattr(estimate, "module", None)
        if not isinstance(module, nn.Module):
            raise TypeError(f"the estimate must carry a torch.nn.Module as .module, got {type(estimate).__name__}")
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        size = max(self.batch_size, 256)
        steps = max(-(-count // size) for count in self.schedule.window_counts)
        source = window_batches(self._ids, block=self.block, batch_size=size, shuffle=False, seed=0)
        total = torch.zeros(2, dtype=torch.float64)
        was_training = module.training
        module.eval()
        with torch.no_grad():
            for _ in range(steps):
                x, y = padded_batch(next(source, None), block=self.block, batch_size=size, device=device)
                real = y != IGNORE_INDEX
                logp = torch.log_softmax(module(x).double(), dim=-1)
                total[0] += int(real.sum())
                total[1] += logp[real].gather(1, y[real][:, None]).sum().cpu()
        module.train(was_training)
        if dist.is_initialized() and self.world > 1 and self.shard_by_rank:
            dist.all_reduce(total)
        return float(total[0]), float(total[1])

    def close(self) -> None:
        """Destroy the process group, if this handle created it (``destroy_default_group``: what the training left
        in reference cycles is freed first, while the group and the interpreter are whole)."""
        if self._owns_pg:
            destroy_default_group()
        self._owns_pg = False

    def __enter__(self) -> StreamingTokenEncodedData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _expected_rank_world(init: bool) -> tuple[int, int]:
    """(rank, world size) of the existing group, else of the torchrun environment when it will be created."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if not init or "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise ValueError(f"RANK={os.environ['RANK']!r} / WORLD_SIZE={os.environ['WORLD_SIZE']!r} are not "
                         "integers; launch with torchrun") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is not a rank of WORLD_SIZE={world}; launch with torchrun")
    return rank, world


def _maybe_init_process_group(init: bool, backend: str | None) -> bool:
    """Create the default group from the torchrun environment (RANK, WORLD_SIZE) when none exists."""
    if not init or not dist.is_available() or dist.is_initialized():
        return False
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return False  # not launched by torchrun: one process, no group
    if backend is None:
        backend = comm_backend_for("cuda" if torch.cuda.is_available() else "cpu")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend='nccl' needs CUDA devices; use backend='gloo' on CPU")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK") or 0))
    dist.init_process_group(backend=backend)
    return True


def _checkpoint_blocks(module: nn.Module) -> None:
    """Recompute each of ``module.blocks`` in backward (mixle's activation checkpointing)."""
    blocks = getattr(module, "blocks", None)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        raise ValueError("activation_checkpointing=True needs the module's layers in an nn.ModuleList .blocks")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper

    for i, blk in enumerate(blocks):
        if not isinstance(blk, CheckpointWrapper):
            blocks[i] = checkpoint_wrapper(blk)
