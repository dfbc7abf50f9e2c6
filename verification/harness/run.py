"""The verification harness: run an executor on a real small mesh and a single-process reference.

``verify(executor, plan, precision=..., workload=..., trials=..., seed=..., tolerance=...)``
spawns ``plan.world_size`` gloo ranks on CPU (or lets a ``verification_launch = "self"``
executor start its own workers), runs every trial twice in fresh process groups, and judges
each declared ``DistributedUpdate`` on three checks, each named in failures:

* ``numerics``: max absolute / relative error of the update's observables against the
  workload's independent single-process reference (torch.testing's rule and the precision's
  default tolerance; EM within the stated fp64 bound of ``em_reference``);
* ``determinism``: the repeats' digests are equal on every rank, and, for executors that start
  their own workers, the run is bitwise the same executor on one worker;
* ``collectives``: the declared (collective, axes) was seen in the traced steps, in a phase where
  that update communicates and not taken by another update (``attribution``), and nothing
  undeclared was (counts from PyTorch's flight recorder);
* ``receipts``: for trials that expose ``receipts()``, every step's receipts report the counts and
  bytes the flight recorder saw (``receipts``).

The result holds ``NumericsEvidence`` per update and evidence-bearing ``DistributedUpdate``s;
``report.certify(executor)`` turns a passing report into a signed certificate (``CertificateEnvelope``).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import attrs

from ...contracts import (
    CollectiveKind,
    DistributedUpdate,
    NumericsEvidence,
    ObservedCollective,
    ParallelPlan,
    Tolerance,
)
from ..certification import CertificationError, certify
from ..sdc.digest import digest
from .attribution import Attribution, allowed_phases, attribute, unwitnessed_reason
from .collectives import realign, realized_kinds, summarize
from .mesh import DEFAULT_TIMEOUT_S, mesh_kind, run_on_gloo_mesh
from .receipt_check import judge_receipts
from .tolerance import EM_STATISTICS_TOLERANCE as _BITWISE
from .tolerance import MIXED_SCALED, compare, default_tolerance
from .worker import gloo_rank_main, resolve_executor, run_trials
from .workloads import resolve_workload

_FLOAT_MAX = sys.float_info.max


@attrs.frozen
class VerificationReport:
    """What the harness measured: evidence per update, evidence-bearing updates, failures by check."""

    executor: str
    executor_version: str
    plan: ParallelPlan
    precision: str
    workload: str
    evidence: tuple[NumericsEvidence, ...]
    updates: tuple[DistributedUpdate, ...]
    failures: tuple[str, ...]
    observed_collectives: tuple[ObservedCollective, ...]
    seconds: float
    receipts: tuple[str, ...] = ()
    """One line per compared step: the receipts' bytes and counts beside the flight recorder's."""

    @property
    def passed(self) -> bool:
        """True when every declared update passed every check."""
        return not self.failures and all(e.passed for e in self.evidence)

    @property
    def failed_checks(self) -> frozenset[str]:
        """Names of the checks that failed (numerics, determinism, collectives, observables)."""
        return frozenset(f.split("check '", 1)[1].split("'", 1)[0] for f in self.failures if "check '" in f)

    def certify(self, executor: Any, **kwargs: Any) -> Any:
        """A signed certificate envelope from this report, recording device kind and comm backend (``certify``)."""
        if self.failures:
            raise CertificationError("verification failed: " + "; ".join(self.failures))
        target = resolve_executor(executor)
        device_kind, comm_backend = mesh_kind(target, self.plan.world_size)
        kwargs.setdefault("device_kind", device_kind)
        kwargs.setdefault("comm_backend", comm_backend)
        return certify(self.evidence, executor=target, plan=self.plan, precision=self.precision, **kwargs)

    def summary(self) -> str:
        """A plain-text table: one row per update, then the failures."""
        rows = [f"{self.executor} {self.executor_version} on {self.plan.describe()} at {self.precision}, "
                f"workload {self.workload}: {'PASSED' if self.passed else 'FAILED'} in {self.seconds:.1f}s",
                f"{'update':<28}{'max abs':>11}{'max rel':>11}{'determ.':>9}{'collect.':>10}{'samples':>9}"]
        for e in self.evidence:
            rows.append(f"{e.node_id:<28}{e.maximum_absolute_error:>11.2e}{e.maximum_relative_error:>11.2e}"
                        f"{'yes' if e.deterministic else 'NO':>9}{'ok' if e.collectives_match else 'NO':>10}"
                        f"{e.sample_count:>9}")
        rows += [f"FAIL {f}" for f in self.failures]
        return "\n".join(rows)


def _family(workload: Any) -> str:
    return "training" if hasattr(workload, "build_module") else "em"


def _reference(workload: Any, precision: str, seeds: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The workload's independent single-process reference per seed (never the executor itself)."""
    return {seed: workload.reference(seed, precision) for seed in seeds}


def default_workload(plan: ParallelPlan, launch: str) -> str:
    """The built-in workload for a plan: EM's mixture for self-launching executors, the bidirectional
    attention LM when the plan has context parallelism, the mixture of experts for expert
    parallelism, else the MLP."""
    if launch == "self":
        return "gaussian_mixture"
    if plan.ep > 1:
        return "moe"
    return "attention" if plan.cp > 1 else "mlp"


def _worker_invariance(local: Any, work: Any, plan: ParallelPlan, precision: str, seeds: list[int],
                       by_rank: list[list[dict[str, Any]]]) -> dict[str, str]:
    """Per update, where the run on ``plan`` differs in bits from the same executor on one worker."""
    if plan.world_size == 1:
        return {}
    single = run_trials(local, work, ParallelPlan(), precision=precision, seeds=seeds, repeats=1, rank=0,
                        world_size=1, trace=False)
    ones = {run["seed"]: run["steps"] for run in single}
    found: dict[str, str] = {}
    for run in by_rank[0]:
        if run["repeat"]:
            continue
        for step, (many, one) in enumerate(zip(run["steps"], ones[run["seed"]])):
            for node, values in many["observables"].items():
                for key, value in sorted(values.items()):
                    other = one["observables"].get(node, {}).get(key)
                    if node not in found and (other is None or not compare(value, other, _BITWISE).within):
                        found[node] = (f"{key} at step {step} (seed {run['seed']}) with {plan.world_size} "
                                       "workers differs in bits from 1 worker")
    return found


def _observed_pairs(plan: ParallelPlan, by_rank: list[list[dict[str, Any]]], traced: bool, *, first_step: int = 0,
                    ) -> tuple[Counter, tuple[str, ...], bool]:
    """Per-rank totals of (kind, axes) over repeat-0 steps >= ``first_step`` (max over ranks), strays, reported?"""
    best: Counter = Counter()
    strays: set[str] = set()
    reported = True
    for runs in by_rank:
        mine: Counter = Counter()
        for run in runs:
            if run["repeat"]:
                continue
            for step in run["steps"][first_step:]:
                found = step["collectives"]
                if found is None:
                    reported = False
                    continue
                if traced:
                    observed, stray = summarize(plan, found)
                    strays.update(stray)
                else:
                    observed = found
                for item in observed:
                    mine[(item.kind, tuple(sorted(item.axes)))] += item.count
        for pair, count in mine.items():
            best[pair] = max(best[pair], count)
    return best, tuple(sorted(strays)), reported


def verify(
    executor: Any,
    plan: ParallelPlan,
    *,
    precision: str = "fp32",
    workload: Any = None,
    trials: int = 1,
    seed: int = 0,
    tolerance: Tolerance | None = None,
    repeats: int = 2,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> VerificationReport:
    """Measure ``executor`` on ``plan`` against the single-process reference; see the module docstring."""
    if trials < 1 or repeats < 2:
        raise ValueError(f"need trials >= 1 and repeats >= 2 (determinism), got trials={trials} repeats={repeats}")
    started = time.perf_counter()
    local = resolve_executor(executor)
    local.capabilities.validate(plan, precision)
    updates = tuple(local.describe_updates(plan))
    if not updates:
        raise ValueError(f"{local.capabilities.name} declares no updates for {plan.describe()}; nothing to verify")
    launch = getattr(local, "verification_launch", "gloo")
    work = resolve_workload(workload if workload is not None else default_workload(plan, launch))
    if not callable(getattr(work, "reference", None)):
        raise ValueError(f"workload {getattr(work, 'name', work)!r} has no reference(seed, precision): the harness "
                         "compares every executor with an independent single-process reference, never with itself")
    family = _family(work)
    tol = tolerance or default_tolerance(precision, family=family)
    seeds = [seed + t for t in range(trials)]
    if launch == "gloo":
        by_rank = run_on_gloo_mesh(gloo_rank_main, plan.world_size, executor, work, plan, precision, seeds, repeats,
                                   timeout=timeout)
    elif launch == "self":
        by_rank = [run_trials(local, work, plan, precision=precision, seeds=seeds, repeats=repeats, rank=0,
                              world_size=plan.world_size, trace=False)]
    else:
        raise ValueError(f"{local.capabilities.name}.verification_launch={launch!r}; expected 'gloo' or 'self'")
    reference = _reference(work, precision, seeds)
    variant = _worker_invariance(local, work, plan, precision, seeds, by_rank) if launch == "self" else {}
    observed, strays, reported = _observed_pairs(plan, by_rank, traced=launch == "gloo")
    # step 0 may hold lazy set-up (DDP bucket rebuild broadcasts, FSDP lazy init): judge
    # undeclared collectives on the steady steps after it when the workload has more than one
    steady, strays, _ = _observed_pairs(plan, by_rank, traced=launch == "gloo", first_step=1 if work.steps > 1 else 0)
    failures: list[str] = []
    backend = "gloo" if launch == "gloo" else "self"
    attribution = attribute(updates, by_rank, plan, traced=launch == "gloo", backend=backend,
                            first_step=1 if work.steps > 1 else 0)
    receipt_failures, receipt_lines = judge_receipts(updates, by_rank) if launch == "gloo" else ({}, ())
    declared = {(kind, tuple(sorted(u.mesh_axes))) for u in updates if u.collective is not CollectiveKind.NONE
                for kind in realized_kinds(u.collective, backend)}
    # a group that is both a physical axis's and an overlapping axis's (dp_replicate=2, ep=2 on 2 ranks)
    observed, steady = realign(plan, observed, declared), realign(plan, steady, declared)
    undeclared = [f"{kind.value} over {[a.value for a in axes]} x{n}" for (kind, axes), n in sorted(steady.items())
                  if (kind, axes) not in declared] + list(strays)
    if undeclared:
        failures.append(
            f"check 'collectives' failed: undeclared collectives observed in steps: {', '.join(undeclared)}"
        )
    evidence, evidenced = [], []
    for update in updates:
        record = _judge(update, by_rank, reference, tol, attribution, bool(undeclared), reported, local, plan,
                        precision, trials, failures, launch, variant.get(update.node_id),
                        receipt_failures.get(update.node_id, []))
        if record is None:
            evidenced.append(update)
            continue
        evidence.append(record)
        evidenced.append(
            attrs.evolve(
                update,
                determinism_observed=record.deterministic,
                maximum_absolute_error=record.maximum_absolute_error,
                maximum_relative_error=record.maximum_relative_error,
                numerics_evidence_id=record.evidence_id,
                numerics_sample_count=record.sample_count,
            )
        )
    all_observed = tuple(ObservedCollective(k, a, n) for (k, a), n in sorted(observed.items()))
    return VerificationReport(
        local.capabilities.name,
        str(local.version),
        plan,
        precision,
        work.name,
        tuple(evidence),
        tuple(evidenced),
        tuple(failures),
        all_observed,
        time.perf_counter() - started,
        receipt_lines,
    )


def _judge_collectives(
    update: DistributedUpdate,
    attribution: Attribution,
    undeclared: bool,
    reported: bool,
    launch: str,
    notes: list[str],
    failures: list[str],
) -> tuple[list[ObservedCollective], bool]:
    """The collectives attributed to ``update`` and whether they match its declaration (notes and
    failures are appended to)."""
    where = f"update {update.node_id!r}"
    seen: list[ObservedCollective] = []
    collectives_ok = not undeclared
    if update.collective is not CollectiveKind.NONE:
        backend = "gloo" if launch == "gloo" else "self"
        seen = [ObservedCollective(c.kind, update.mesh_axes, c.count) for c in attribution.observed(update.node_id)]
        if launch == "gloo":
            notes.append(f"attributed by phase ({', '.join(sorted(allowed_phases(update)))})")
        if any(c.kind is not update.collective for c in seen):
            notes.append(
                f"gloo realizes {update.collective.value} as "
                f"{', '.join(c.kind.value for c in seen if c.kind is not update.collective)}"
            )
        if not reported:
            collectives_ok = False
            failures.append(
                f"{where}: check 'collectives' failed: the executor launches its own workers and "
                "reports no collectives (implement trial.observed_collectives())"
            )
        elif not attribution.witnessed.get(update.node_id):
            collectives_ok = False
            failures.append(f"{where}: check 'collectives' failed: {unwitnessed_reason(update, attribution, backend)}")
        misplaced = attribution.misplaced.get(update.node_id)
        if misplaced:
            collectives_ok = False
            early = any("backward_early" in m for m in misplaced)
            why = " (a backward before the step's last: synchronized on a non-commit micro-step)" if early else ""
            failures.append(f"{where}: check 'collectives' failed: {', '.join(misplaced)}, a phase where it does not "
                            f"communicate{why}")
    return seen, collectives_ok


def _judge(update: DistributedUpdate, by_rank: list[list[dict[str, Any]]], reference: Mapping[int, list[dict]],
           tol: Tolerance, attribution: Attribution, undeclared: bool, reported: bool, executor: Any,
           plan: ParallelPlan, precision: str, trials: int, failures: list[str], launch: str,
           variant: str | None = None, receipt_mismatches: list[str] | None = None) -> NumericsEvidence | None:
    where = f"update {update.node_id!r}"
    max_abs = max_rel = 0.0
    samples, within, deterministic = 0, True, True
    notes: list[str] = []
    worst = ""
    compared: set[str] = set()
    for rank, runs in enumerate(by_rank):
        digests: dict[int, set[str]] = {}
        for run in runs:
            per_run = []
            for step, record in enumerate(run["steps"]):
                values = record["observables"].get(update.node_id)
                if values is None or not values:
                    failures.append(
                        f"{where}: check 'observables' failed: no observables at step {step} on rank {rank}"
                    )
                    return None
                per_run.append(values)
                if run["repeat"]:
                    continue
                compared.update(values)
                for key, value in sorted(values.items()):
                    expected = reference[run["seed"]][step].get(key)
                    if expected is None:
                        failures.append(
                            f"{where}: check 'observables' failed: key {key!r} is not in the reference "
                            f"(it has {sorted(reference[run['seed']][step])})"
                        )
                        return None
                    try:
                        result = compare(value, expected, tol, scaled=precision in MIXED_SCALED)
                    except ValueError as exc:
                        failures.append(f"{where}: check 'observables' failed: {key!r} on rank {rank}: {exc}")
                        return None
                    samples += result.sample_count
                    if result.maximum_absolute_error >= max_abs:
                        worst = f"{key} (rank {rank}, step {step}, seed {run['seed']})"
                    max_abs = max(max_abs, min(result.maximum_absolute_error, _FLOAT_MAX))
                    max_rel = max(max_rel, min(result.maximum_relative_error, _FLOAT_MAX))
                    within &= result.within
            digests.setdefault(run["seed"], set()).add(digest(per_run))
        if any(len(d) > 1 for d in digests.values()):
            deterministic = False
            notes.append(f"rank {rank}: repeats differ")
    if samples == 0:
        failures.append(f"{where}: check 'observables' failed: nothing to compare")
        return None
    if not within:
        failures.append(
            f"{where}: check 'numerics' failed: max abs error {max_abs:.3g}, max rel error "
            f"{max_rel:.3g} at {worst}, outside atol={tol.atol} rtol={tol.rtol}"
            f"{' (bitwise)' if tol.bitwise else ''}"
        )
    if variant is not None:
        deterministic = False
        notes.append(variant)
    if not deterministic:
        failures.append(f"{where}: check 'determinism' failed: {'; '.join(notes)}")
    seen, collectives_ok = _judge_collectives(update, attribution, undeclared, reported, launch, notes, failures)
    if receipt_mismatches:
        collectives_ok = False
        more = f" (and {len(receipt_mismatches) - 2} more)" if len(receipt_mismatches) > 2 else ""
        failures.append(f"{where}: check 'receipts' failed: {'; '.join(receipt_mismatches[:2])}{more}")
    if launch == "self" and reported:
        notes.append("collective counts self-reported by the executor")
    if launch == "self":
        notes.append("bitwise equal to the same executor on one worker" if variant is None else
                     "NOT bitwise equal to the same executor on one worker")
    names = sorted(compared)
    notes.append(f"compared {len(names)} tensors: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}")
    return NumericsEvidence(
        node_id=update.node_id,
        payload=update.payload,
        executor=executor.capabilities.name,
        plan=plan,
        precision=precision,
        trials=trials,
        sample_count=samples,
        maximum_absolute_error=max_abs,
        maximum_relative_error=max_rel,
        deterministic=deterministic,
        within_tolerance=within,
        tolerance=tol,
        collectives_observed=tuple(seen),
        collectives_match=collectives_ok,
        notes=tuple(notes),
    )
