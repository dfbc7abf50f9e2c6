"""The SDC audit's independent reference for tensor-parallel plans: a plain copy, judged within a tolerance.

A tensor-parallel executor's replays (the peer's and the same rank's) run its own code, so an executor
that computes a wrong gradient the same way every time agrees with itself. On an audited step
:class:`TensorParallelReference` gathers every full parameter with ``DTensor.full_tensor()`` (torch's own
collectives, not the executor's comm objects) into a plain copy of the module taken before it was split
(``sdc_reference.reference_template``), recomputes this rank's window with plain torch, cuts this rank's
shard out of each full gradient from the parameter's placement on the ``tp`` mesh dimension and its mesh
coordinate, and compares it with the local (pre-data-parallel-reduction) gradient the taps captured.

TP splits matmuls, so its sums run in another order than the copy's: the comparison is not bitwise but the
verification harness's rule, ``|local - reference| <= atol + rtol * |reference|`` elementwise, with the
harness's default tolerance for the session's precision (``verification.harness.tolerance``) and the
absolute term scaled to the tensor's largest ``|reference|`` (``compare(..., scaled=True)``: a rounding of a
split sum is relative to its summands); ``audit_bound > 0`` replaces it with that max abs difference. The
executor's bitwise peer replay keeps catching bit flips; this reference catches an executor that is wrong
the same way on every replay. The gathered parameters and the copy's gradients are freed after the audit.

The reference is skipped, and every audited step's receipt says why (``tp_reference_skip_reason``), when
the module cannot be recomputed on one rank: meta parameters, parameters above ``MAX_REFERENCE_BYTES``,
active dropout (a plain copy draws other random numbers than the TP shards do), or no copy could be made.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import nn

from ...contracts import SDCAuditRecord, Tolerance
from ...verification.harness.tolerance import compare, default_tolerance
from ...verification.sdc.digest import digest
from .in_situ_probe import MAX_PROBE_BYTES
from .layouts import is_shard, local_part
from .sdc_reference import PlainReference

__all__ = ["MAX_REFERENCE_BYTES", "TensorParallelReference", "attribute_causes", "build_tp_reference",
           "reference_record", "reference_tolerance", "tp_reference_applies", "tp_reference_skip_reason"]

MAX_REFERENCE_BYTES = MAX_PROBE_BYTES
"""Above this many parameter bytes the full module is not gathered onto one rank (the in-situ probe's rule)."""

_MAX = 1.7976931348623157e308


def tp_reference_applies(plan: Any) -> bool:
    """Whether the tensor-parallel reference covers ``plan``: tp > 1 beside data-parallel axes only (context
    parallelism refuses the audit; pipeline and expert parallelism are megatron's)."""
    return int(plan.tp) > 1 and int(plan.world_size) == int(plan.dp_replicate) * int(plan.dp_shard) * int(plan.tp) \
        and plan.ep == 1 and plan.etp == 1


def tp_reference_skip_reason(module: nn.Module) -> str | None:
    """Why the full ``module`` cannot be recomputed on one rank (works before and after TP splits it), or None."""
    params = list(module.parameters())
    if any(p.is_meta for p in params):
        return "the module has parameters on the meta device (deferred initialization): nothing to gather"
    size = sum(p.numel() * p.element_size() for p in params)  # a DTensor's numel is its global size
    if size > MAX_REFERENCE_BYTES:
        return (f"the module's parameters take {size / 2**30:.2f} GiB, above the reference's one-rank limit of "
                f"{MAX_REFERENCE_BYTES / 2**30:.2f} GiB")
    dropout = [name for name, m in module.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
    if dropout:
        return (f"the module has active dropout ({', '.join(dropout[:3])}): a plain copy draws other random numbers "
                "than the tensor-parallel shards, so it cannot recompute their gradient")
    return None


def reference_tolerance(bound: float, precision: str) -> Tolerance:
    """``audit_bound`` as a max abs difference when it is > 0; else the harness's default for ``precision``."""
    if bound > 0:
        return Tolerance(atol=bound, rtol=0.0, source="audit_bound: the allowed max abs difference")
    return default_tolerance(precision)


@attrs.frozen
class ShardComparison:
    """This rank's gradient shard against the reference's: the verdict and what the record needs."""

    matched: bool
    expected_digest: str
    difference: float
    bound: float
    outside: tuple[str, ...]


class TensorParallelReference:
    """The plain copy of a tensor-parallel session's module, gathered for audited windows only."""

    sharded = True
    """The full parameters are gathered for each audited window (``load``) and freed after it (``release``)."""

    def __init__(self, session: Any, template: nn.Module, tolerance: Tolerance) -> None:
        self.session, self.tolerance = session, tolerance
        self.plain = PlainReference(session, template)
        self.live = dict(session.named_trainable())

    @property
    def names(self) -> frozenset[str]:
        """The trainable parameters the copy computes gradients for (pre-wrap names)."""
        return self.plain.names

    def load(self) -> None:
        """Every full parameter into the copy (a collective: every rank calls it, in the same order)."""
        self.plain.load()

    def release(self) -> None:
        """Free the gathered parameters and the copy's gradients."""
        self.plain.release()

    def local_shard(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the full gradient ``full`` of parameter ``name``: the chunk of its ``tp`` mesh
        coordinate along the dimension its placement on ``tp`` shards (the whole tensor when replicated)."""
        live = self.live[name]
        mesh = getattr(live, "device_mesh", None)
        if mesh is None:
            return full
        coordinate = mesh.get_coordinate()
        for index, (dim_name, placement) in enumerate(zip(mesh.mesh_dim_names or (), live.placements)):
            if dim_name == "tp" and is_shard(placement) and mesh.size(index) > 1:
                assert coordinate is not None  # a rank of the mesh has a coordinate
                full = full.chunk(mesh.size(index), dim=placement.dim)[coordinate[index]]
        return full

    def compare(self, window: list, rng_restore: Any, buffers: list[torch.Tensor] | None,
                observed: dict[str, torch.Tensor]) -> ShardComparison:
        """Recompute the window on the copy and judge each observed gradient against this rank's shard of it."""
        full = self.plain.gradient(window, rng_restore, buffers)
        expected, worst, bound, outside = {}, 0.0, 0.0, []
        for name in sorted(observed):
            local = local_part(observed[name])
            if name not in full:
                worst = _MAX
                outside.append(name)
                continue
            want = self.local_shard(name, full[name])
            expected[name] = want
            if tuple(want.shape) != tuple(local.shape):
                worst = _MAX
                outside.append(name)
                continue
            result = compare(local, want, self.tolerance, scaled=True)
            atol = max(self.tolerance.atol, self.tolerance.rtol * result.reference_magnitude)
            bound = max(bound, atol + self.tolerance.rtol * result.reference_magnitude)
            worst = max(worst, min(result.maximum_absolute_error, _MAX))
            if not result.within:
                outside.append(name)
        return ShardComparison(not outside, digest(expected), worst, bound, tuple(outside))


def reference_record(audit: Any, step: int, found: ShardComparison, observed_digest: str,
                     injected: bool) -> SDCAuditRecord:
    """The ``reference`` record of this rank's window (its cause is set once the same-rank replay is known)."""
    unit = "local_gradient" if found.matched else (
        "local_gradient[" + ",".join(found.outside[:4]) + (",..." if len(found.outside) > 4 else "") + "]")
    return SDCAuditRecord(
        family="training", step=step, rank=audit.rank, unit=unit, replay="reference",
        expected_digest=found.expected_digest, observed_digest=observed_digest, matched=found.matched,
        action="none" if found.matched else audit.action(""), auditor_rank=audit.rank,
        attributed_rank=None if found.matched else audit.rank, maximum_absolute_difference=min(found.difference, _MAX),
        bound=found.bound, injected=injected)


def attribute_causes(records: list[SDCAuditRecord]) -> list[SDCAuditRecord]:
    """Each failed ``reference`` record gets its cause from its rank's same-rank replay through the executor:
    reproduced (matched) -> ``backend_defect``, not reproduced -> ``device`` (the same on every rank)."""
    replayed = {r.rank: r.matched for r in records if r.replay == "same_rank" and r.unit != "parameters at rest"}
    out = []
    for r in records:
        if r.replay == "reference" and not r.matched and not r.cause and r.rank in replayed:
            r = attrs.evolve(r, cause="backend_defect" if replayed[r.rank] else "device")
        out.append(r)
    return out


def build_tp_reference(session: Any, template: nn.Module | None,
                       bound: float) -> tuple[TensorParallelReference | None, str | None]:
    """(the session's ``TensorParallelReference``, None), or (None, why it is skipped) for a TP session."""
    reason = tp_reference_skip_reason(session.module)
    if reason is None and template is None:
        reason = "the module could not be copied before tensor parallelism split it (see the warning at prepare)"
    if reason is not None:
        return None, reason
    try:
        tolerance = reference_tolerance(bound, session.precision)
    except ValueError as exc:
        return None, f"no tolerance to judge it: {exc}"
    assert template is not None  # no reason: the template exists
    return TensorParallelReference(session, template, tolerance), None


