"""The in-situ probe of the user's own module: one seeded forward/backward through the executor, checked on rank 0.

Before a launched run's first step (``verification.in_situ``), every rank prepares a deep copy of the
module it was given, through the same backend and plan, and trains one seeded step on synthesized
inputs with a seeded weighted-sum loss; rank 0 recomputes the gradient of the whole global batch on
another plain copy in one process and compares every parameter's gradient (the precision's harness
tolerance). It checks the executor's gradient path on the user's module (its hooks, its autograd
functions, the reduction), not the user's loss function or data. It is skipped, with the reason
recorded in the certificate, when no one-rank recomputation is possible: the module is split by
tensor or context parallelism, holds meta parameters, is too large for one rank, or its first layer
is none of ``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.BatchNorm1d``, ``nn.Conv1d``,
``nn.Conv2d`` (no input can be synthesized). The recomputation runs the forward on each rank's share of each
accumulation step separately, as the executor does, so a layer whose output depends on its batch (batch
normalization) is compared with what it should compute, not with one global batch's statistics.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ...contracts import ParallelPlan, UnusedParametersError
from ...verification.harness.tolerance import compare, default_tolerance
from ...verification.in_situ import ProbeOutcome
from .dp_mode import DataParallelMode

__all__ = ["MAX_PROBE_BYTES", "probe_module"]

MAX_PROBE_BYTES = 2 << 30
"""A module above this many parameter bytes is not copied twice for a one-rank recomputation (probe skipped)."""

ROWS_PER_CALL = 2
PROBE_SEED = 20_231


def _skip_reason(module: nn.Module, plan: ParallelPlan) -> str | None:
    """Why no one-rank recomputation of ``module`` can be compared, or None."""
    if plan.tp > 1 or plan.cp > 1 or plan.pp > 1:
        return (f"{plan.describe()} splits the module across ranks (tensor/context/pipeline parallelism); the probe "
                "compares data-parallel gradient paths only")
    params = list(module.parameters())
    if not any(p.requires_grad for p in params):
        return "the module has no trainable parameters"
    if any(p.is_meta for p in params):
        return "the module has parameters on the meta device (deferred initialization): nothing to recompute"
    size = sum(p.numel() * p.element_size() for p in params)
    if size > MAX_PROBE_BYTES:
        return f"the module's parameters take {size / 2**30:.1f} GiB, above the probe's one-rank limit of 2 GiB"
    return None


SPATIAL = 8
"""Length of each spatial dimension of a synthesized convolution input, beyond the kernel's reach."""

_NORMS = (nn.LayerNorm, nn.RMSNorm)


def _spatial(conv: nn.Conv1d | nn.Conv2d) -> tuple[int, ...]:
    """A small spatial size every kernel of ``conv`` fits into (its dilated reach, plus ``SPATIAL``)."""
    return tuple((k - 1) * d + SPATIAL for k, d in zip(conv.kernel_size, conv.dilation))


def _synthesized_input(module: nn.Module, rows: int, generator: torch.Generator) -> torch.Tensor | str:
    """Seeded inputs for the module's first parameterized layer, or why none can be made: token ids for
    ``nn.Embedding``; features for ``nn.Linear``, ``nn.LayerNorm``/``nn.RMSNorm`` (their normalized shape) and
    ``nn.BatchNorm1d``; channels over a small spatial size for ``nn.Conv1d``/``nn.Conv2d``."""
    first = next((m for m in module.modules() if not list(m.children()) and list(m.parameters(recurse=False))), None)
    if isinstance(first, nn.Embedding):
        return torch.randint(0, first.num_embeddings, (rows, 4), generator=generator)
    if isinstance(first, nn.Linear):
        return torch.randn(rows, first.in_features, generator=generator)
    if isinstance(first, _NORMS) and first.normalized_shape is not None:
        return torch.randn(rows, *first.normalized_shape, generator=generator)
    if isinstance(first, nn.BatchNorm1d):
        return torch.randn(rows, first.num_features, generator=generator)
    if isinstance(first, (nn.Conv1d, nn.Conv2d)):
        return torch.randn(rows, first.in_channels, *_spatial(first), generator=generator)
    kind = type(first).__name__ if first is not None else "no layer"
    return (f"the module's first layer is {kind}: the probe synthesizes inputs for nn.Linear, nn.Embedding, "
            "nn.LayerNorm, nn.RMSNorm, nn.BatchNorm1d, nn.Conv1d and nn.Conv2d only")


def _probe_loss(module: nn.Module, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded weighted sum of the outputs over the batch, and the batch's row count (the session divides)."""
    return (module(x).float() * w).sum(), torch.tensor(x.shape[0])


def _global_batch(module: nn.Module, plan: ParallelPlan) -> tuple[torch.Tensor, torch.Tensor] | str:
    """The probe's global inputs and loss weights (the same on every rank), or why none can be made."""
    generator = torch.Generator().manual_seed(PROBE_SEED)
    rows = ROWS_PER_CALL * plan.gradient_accumulation_steps * plan.data_parallel_size
    inputs = _synthesized_input(module, rows, generator)
    if isinstance(inputs, str):
        return inputs
    try:
        with torch.no_grad():
            out = copy.deepcopy(module)(inputs[:ROWS_PER_CALL])
    except Exception as exc:  # noqa: BLE001 - a module that takes other inputs is skipped, saying why
        return f"the module's forward on a synthesized {tuple(inputs.shape)} input raised {type(exc).__name__}: {exc}"
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return "the module's forward does not return one floating-point tensor"
    return inputs, torch.randn((rows, *out.shape[1:]), generator=generator)


def _executor_gradients(backend: Any, module: nn.Module, plan: ParallelPlan, batch: tuple[torch.Tensor, torch.Tensor],
                        prepare_options: dict[str, Any], rank: int) -> dict[str, torch.Tensor]:
    """Every parameter's committed gradient after one step of the probe through ``backend`` (full, on CPU)."""
    captured: dict[str, torch.Tensor] = {}

    def optimizer(params: Any) -> torch.optim.Optimizer:
        opt = torch.optim.SGD(params, lr=0.0)
        step = opt.step

        def capturing_step(*args: Any, **kwargs: Any) -> Any:
            captured.update({str(id(p)): p.grad.detach().clone() for g in opt.param_groups for p in g["params"]
                             if p.grad is not None})
            return step(*args, **kwargs)

        opt.step = capturing_step  # type: ignore[method-assign]
        return opt

    session = backend.prepare(copy.deepcopy(module), plan=plan, loss_fn=_probe_loss, optimizer=optimizer,
                              audit=False, **prepare_options)
    try:
        calls = plan.gradient_accumulation_steps
        size, index = plan.data_parallel_size, rank  # data-parallel plans: the rank is the data-parallel index
        inputs, weights = (t.tensor_split(size)[index] for t in batch)
        for x, w in zip(inputs.tensor_split(calls), weights.tensor_split(calls)):
            session.train_batch(x, w)
        names = {str(id(p)): n.removeprefix("module.") for n, p in session.module.named_parameters()}
        return {names[key]: _full(grad) for key, grad in captured.items()}
    finally:
        session.close()


def _full(grad: torch.Tensor) -> torch.Tensor:
    tensor = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return tensor.detach().float().cpu()


def _reference_gradients(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor],
                         plan: ParallelPlan) -> dict[str, torch.Tensor]:
    """The gradient of the global-batch mean loss on a plain copy of the module, in this one process: the forward
    on each data-parallel rank's share of each accumulation step, as the executor cuts them (``_shares``)."""
    plain = copy.deepcopy(module).float()
    device = next(plain.parameters()).device
    total = torch.zeros((), device=device)
    for x, w in _shares(batch, plan):
        total = total + _probe_loss(plain, x.to(device), w.to(device))[0]
    (total / batch[0].shape[0]).backward()
    return {n: p.grad.detach().float().cpu() for n, p in plain.named_parameters() if p.grad is not None}


def _shares(batch: tuple[torch.Tensor, torch.Tensor], plan: ParallelPlan) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every (inputs, weights) one forward of the executor sees: rank by rank, accumulation step by step."""
    calls, out = plan.gradient_accumulation_steps, []
    for inputs, weights in zip(*(t.tensor_split(plan.data_parallel_size) for t in batch)):
        out += list(zip(inputs.tensor_split(calls), weights.tensor_split(calls)))
    return out


def probe_module(backend: Any, module: nn.Module, plan: ParallelPlan, *, precision: str,
                 prepare_options: dict[str, Any], rank: int) -> ProbeOutcome:
    """Run the probe on this rank (all ranks together); rank 0's outcome says passed/failed/skipped and why."""
    reason = _skip_reason(module, plan)
    batch = _global_batch(module, plan) if reason is None else reason
    if isinstance(batch, str):
        return ProbeOutcome("skipped", batch)
    check_unused = DataParallelMode.for_plan(plan).uses_ddp and not prepare_options.get("find_unused_parameters")
    want = _reference_gradients(module, batch, plan) if rank == 0 or check_unused else {}
    if check_unused:  # every rank: the same module and batch give the same answer, before any collective
        unused = [n for n, p in module.named_parameters() if p.requires_grad and n not in want]
        if unused:  # DDP would leave their buckets unreduced
            raise UnusedParametersError(unused, where="a probe step of the module")
    got = _executor_gradients(backend, module, plan, batch, {"precision": precision, **prepare_options}, rank)
    if rank != 0:
        return ProbeOutcome("skipped", "judged on rank 0")
    tolerance = default_tolerance(precision)
    if set(got) != set(want):
        return ProbeOutcome("failed", f"the executor produced gradients for {sorted(got)}, the module has "
                                      f"{sorted(want)}")
    worst, bad = 0.0, []
    for name in sorted(want):
        result = compare(got[name], want[name], tolerance, scaled=precision != "fp32")
        worst = max(worst, result.maximum_absolute_error)
        if not result.within:
            bad.append(f"{name} (max abs error {result.maximum_absolute_error:.3g})")
    if bad:
        return ProbeOutcome("failed", f"outside atol={tolerance.atol} rtol={tolerance.rtol}: {', '.join(bad)}")
    return ProbeOutcome("passed", f"one seeded step of the module's {len(want)} parameter gradients through the "
                                  f"executor against a one-rank recomputation on rank 0 (atol={tolerance.atol} "
                                  f"rtol={tolerance.rtol})", worst)
