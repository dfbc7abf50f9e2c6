"""Judge a verification run: the traffic on the wire once, then each declared update into an ``UpdateVerdict``.

``judge_wire`` counts what the ranks reported or traced (max over ranks, repeat 0), attributes it to
the declared updates (``attribution``), names undeclared collectives and judges receipts through the
launch strategy. ``judge_update`` compares one update's observables with the reference
(``numerics``), checks its repeats' digests and the one-worker comparison (``determinism``), its
attributed collectives (``collectives``) and receipts (``receipts``), and returns its evidence and
failures; every failure reads ``update '<id>': check '<name>' failed: ...``.
"""

from __future__ import annotations

import sys
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
from ..sdc.digest import digest
from .attribution import Attribution, attribute, unwitnessed_reason
from .collectives import realign, realized_kinds, summarize
from .counts import count_mismatches
from .launch import ByRank, Launch
from .tolerance import MIXED_SCALED, compare

_FLOAT_MAX = sys.float_info.max


@attrs.frozen
class Measured:
    """What the trials produced and what they are judged against, shared by every update's verdict."""

    by_rank: ByRank
    reference: Mapping[int, list[dict[str, Any]]]
    """The workload's independent single-process reference, per seed and step."""
    tolerance: Tolerance
    plan: ParallelPlan
    precision: str
    trials: int
    executor: str
    """The executor's capability name (what the evidence names)."""
    variants: Mapping[str, str] = attrs.field(factory=dict)
    """Per update, how the run differs in bits from the same executor on one worker (``SelfLaunch``)."""


@attrs.frozen
class WireFindings:
    """The run's collectives: attributed per update, the undeclared ones, receipts against the trace."""

    attribution: Attribution
    observed: tuple[ObservedCollective, ...]
    undeclared: tuple[str, ...]
    reported: bool
    """False when a step of a self-launched executor reported no collectives."""
    receipt_mismatches: Mapping[str, list[str]]
    receipt_lines: tuple[str, ...]
    count_mismatches: Mapping[str, list[str]] = attrs.field(factory=dict)
    """Per update, the steps whose observed collective count differs from the executor's declared count."""

    @property
    def failures(self) -> tuple[str, ...]:
        """The run-wide failure: collectives seen that no update declares."""
        if not self.undeclared:
            return ()
        return (f"check 'collectives' failed: undeclared collectives observed in steps: {', '.join(self.undeclared)}",)


@attrs.frozen
class UpdateVerdict:
    """One declared update judged: its evidence (None when there was nothing to compare) and its failures."""

    update: DistributedUpdate
    evidence: NumericsEvidence | None
    failures: tuple[str, ...]

    @property
    def evidenced_update(self) -> DistributedUpdate:
        """The update with the measured evidence attached (as declared when there is none)."""
        record = self.evidence
        if record is None:
            return self.update
        return attrs.evolve(self.update, determinism_observed=record.deterministic,
                            maximum_absolute_error=record.maximum_absolute_error,
                            maximum_relative_error=record.maximum_relative_error,
                            numerics_evidence_id=record.evidence_id, numerics_sample_count=record.sample_count)


def observed_pairs(plan: ParallelPlan, by_rank: ByRank, traced: bool, *, first_step: int = 0,
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


def judge_wire(updates: tuple[DistributedUpdate, ...], by_rank: ByRank, plan: ParallelPlan, launch: Launch,
               first_step: int, counts: Mapping[str, int] | None = None) -> WireFindings:
    """Attribute the run's collectives and name the undeclared ones; undeclared collectives are judged on the
    steps from ``first_step`` (step 0 may hold lazy set-up: DDP's bucket rebuild, FSDP's lazy init)."""
    observed, _, reported = observed_pairs(plan, by_rank, launch.traced)
    steady, strays, _ = observed_pairs(plan, by_rank, launch.traced, first_step=first_step)
    attribution = attribute(updates, by_rank, plan, traced=launch.traced, backend=launch.recorded_as,
                            first_step=first_step)
    mismatches, lines = launch.judge_receipts(updates, by_rank)
    declared = {(kind, tuple(sorted(u.mesh_axes))) for u in updates if u.collective is not CollectiveKind.NONE
                for kind in realized_kinds(u.collective, launch.recorded_as)}
    # a group that is both a physical axis's and an overlapping axis's (dp_replicate=2, ep=2 on 2 ranks)
    observed, steady = realign(plan, observed, declared), realign(plan, steady, declared)
    undeclared = [f"{kind.value} over {[a.value for a in axes]} x{n}" for (kind, axes), n in sorted(steady.items())
                  if (kind, axes) not in declared] + list(strays)
    return WireFindings(attribution, tuple(ObservedCollective(k, a, n) for (k, a), n in sorted(observed.items())),
                        tuple(undeclared), reported, mismatches, lines,
                        count_mismatches(updates, by_rank, counts or {}, launch.recorded_as))


@attrs.define
class _Numerics:
    """The observables of one update against the reference, over every rank, run and step."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    magnitude: float = 0.0
    samples: int = 0
    within: bool = True
    deterministic: bool = True
    worst: str = ""
    notes: list[str] = attrs.Factory(list)
    compared: set[str] = attrs.Factory(set)

    def add(self, key: str, result: Any, where: str) -> None:
        """Fold one compared tensor in (``where``: rank, step and seed, for the worst one)."""
        self.samples += result.sample_count
        if result.maximum_absolute_error >= self.max_abs:
            self.worst = f"{key} ({where})"
        self.max_abs = max(self.max_abs, min(result.maximum_absolute_error, _FLOAT_MAX))
        self.max_rel = max(self.max_rel, min(result.maximum_relative_error, _FLOAT_MAX))
        self.magnitude = max(self.magnitude, result.reference_magnitude)
        self.within &= result.within


def _missing_runs(runs: list[dict[str, Any]], reference: Mapping[int, list[dict[str, Any]]]) -> str:
    """What a rank left out: a seed without a first run and a repeat, or a run with fewer or more steps than
    the reference (a verdict rests only on what every rank was shown to do); empty when complete."""
    for seed, steps in sorted(reference.items()):
        mine = [run for run in runs if run["seed"] == seed]
        if not any(not run["repeat"] for run in mine) or not any(run["repeat"] for run in mine):
            return f"no first run and repeat for seed {seed}"
        for run in mine:
            if len(run["steps"]) != len(steps):
                return f"{len(run['steps'])} of the reference's {len(steps)} steps for seed {seed}"
    return ""


def _compare_observables(update: DistributedUpdate, measured: Measured) -> _Numerics | str:
    """Every rank's repeat-0 observables of ``update`` against the reference, and its repeats' digests;
    a string says why there is nothing to judge."""
    found = _Numerics()
    for rank, runs in enumerate(measured.by_rank):
        missing = _missing_runs(runs, measured.reference)
        if missing:
            return f"rank {rank} reported {missing}"
        digests: dict[int, set[str]] = {}
        for run in runs:
            per_run = []
            for step, record in enumerate(run["steps"]):
                values = record["observables"].get(update.node_id)
                if not values:
                    return f"no observables at step {step} on rank {rank}"
                per_run.append(values)
                if run["repeat"]:
                    continue
                found.compared.update(values)
                expected_step = measured.reference[run["seed"]][step]
                for key, value in sorted(values.items()):
                    expected = expected_step.get(key)
                    if expected is None:
                        return f"key {key!r} is not in the reference (it has {sorted(expected_step)})"
                    try:
                        result = compare(value, expected, measured.tolerance,
                                         scaled=measured.precision in MIXED_SCALED)
                    except ValueError as exc:
                        return f"{key!r} on rank {rank}: {exc}"
                    found.add(key, result, f"rank {rank}, step {step}, seed {run['seed']}")
            digests.setdefault(run["seed"], set()).add(digest(per_run))
        if any(len(d) > 1 for d in digests.values()):
            found.deterministic = False
            found.notes.append(f"rank {rank}: repeats differ")
    return found if found.samples else "nothing to compare"


def _judge_collectives(update: DistributedUpdate, wire: WireFindings, launch: Launch,
                       ) -> tuple[list[ObservedCollective], bool, list[str], list[str]]:
    """The collectives attributed to ``update``, whether they match its declaration, notes, failures."""
    where = f"update {update.node_id!r}"
    if update.collective is CollectiveKind.NONE:
        return [], not wire.undeclared, [], []
    seen = [ObservedCollective(c.kind, update.mesh_axes, c.count) for c in wire.attribution.observed(update.node_id)]
    notes, failures = launch.collective_notes(update), []
    realized = [c.kind.value for c in seen if c.kind is not update.collective]
    if realized:
        notes.append(f"gloo realizes {update.collective.value} as {', '.join(realized)}")
    if not wire.reported:
        failures.append(f"{where}: check 'collectives' failed: the executor launches its own workers and "
                        "reports no collectives (implement trial.observed_collectives())")
    elif not wire.attribution.witnessed.get(update.node_id):
        reason = unwitnessed_reason(update, wire.attribution, launch.recorded_as)
        failures.append(f"{where}: check 'collectives' failed: {reason}")
    wrong_count = wire.count_mismatches.get(update.node_id)
    if wrong_count:
        more = f" (and {len(wrong_count) - 1} more step(s))" if len(wrong_count) > 1 else ""
        failures.append(f"{where}: check 'collectives' failed: {wrong_count[0]}{more}")
    misplaced = wire.attribution.misplaced.get(update.node_id)
    if misplaced:
        early = any("backward_early" in m for m in misplaced)
        why = " (a backward before the step's last: synchronized on a non-commit micro-step)" if early else ""
        failures.append(f"{where}: check 'collectives' failed: {', '.join(misplaced)}, a phase where it does not "
                        f"communicate{why}")
    return seen, not wire.undeclared and not failures, notes, failures


def judge_update(update: DistributedUpdate, measured: Measured, wire: WireFindings, launch: Launch) -> UpdateVerdict:
    """``update`` on the four checks (numerics, determinism, collectives, receipts): evidence and failures."""
    where = f"update {update.node_id!r}"
    numerics = _compare_observables(update, measured)
    if isinstance(numerics, str):
        return UpdateVerdict(update, None, (f"{where}: check 'observables' failed: {numerics}",))
    tol, failures, notes = measured.tolerance, [], list(numerics.notes)
    if not numerics.within:
        failures.append(f"{where}: check 'numerics' failed: max abs error {numerics.max_abs:.3g}, max rel error "
                        f"{numerics.max_rel:.3g} at {numerics.worst}, outside atol={tol.atol} rtol={tol.rtol}"
                        f"{' (bitwise)' if tol.bitwise else ''}")
    variant = measured.variants.get(update.node_id)
    if variant is not None:
        notes.append(variant)
    deterministic = numerics.deterministic and variant is None
    if not deterministic:
        failures.append(f"{where}: check 'determinism' failed: {'; '.join(notes)}")
    seen, collectives_ok, wire_notes, wire_failures = _judge_collectives(update, wire, launch)
    notes += wire_notes
    failures += wire_failures
    mismatches = wire.receipt_mismatches.get(update.node_id)
    if mismatches:
        collectives_ok = False
        more = f" (and {len(mismatches) - 2} more)" if len(mismatches) > 2 else ""
        failures.append(f"{where}: check 'receipts' failed: {'; '.join(mismatches[:2])}{more}")
    notes += launch.closing_notes(wire.reported, variant)
    names = sorted(numerics.compared)
    notes.append(f"compared {len(names)} tensors: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}")
    evidence = NumericsEvidence(
        node_id=update.node_id, payload=update.payload, executor=measured.executor, plan=measured.plan,
        precision=measured.precision, trials=measured.trials, sample_count=numerics.samples,
        maximum_absolute_error=numerics.max_abs, maximum_relative_error=numerics.max_rel,
        deterministic=deterministic, within_tolerance=numerics.within, tolerance=tol,
        collectives_observed=tuple(seen), collectives_match=collectives_ok, notes=tuple(notes),
        reference_magnitude=numerics.magnitude)
    return UpdateVerdict(update, evidence, tuple(failures))
