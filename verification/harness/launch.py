"""How the harness starts an executor's trials, and everything that follows from it: two launch strategies.

An executor names its launch in ``verification_launch`` (``contracts.VERIFICATION_LAUNCHES``);
``launch_for(executor)`` returns the strategy, which owns every difference between the two:

* ``GlooMeshLaunch`` (``"gloo"``, the default): the harness spawns ``plan.world_size`` ranks on a fresh
  process group (gloo on CPU, NCCL where every rank has a GPU: ``mesh.process_group_backend``); each rank
  traces its collectives with PyTorch's flight recorder and the step phases (``phases``), so collectives
  are attributed by phase; a declared reduce-scatter may be recorded as gloo's all-reduce
  (``collectives.GLOO_REALIZATIONS``); receipts are judged against the trace (``receipt_check``).
* ``SelfLaunch`` (``"self"``): the executor starts its own workers (EM pools), so its trials run in this
  process; collectives are reported by the trial (``trial.observed_collectives()``; EM trials count the
  messages at the backend's transport) and held to ``collectives_per_step`` where declared; no
  receipts are judged; and the run must be bitwise the same executor on one worker (worker invariance) and,
  for an executor that claims the bits of one process (``same_bits_reference()``: every EM backend), bitwise
  the fixed fold order that reference computes in one process, so a backend that returns chunk results out of
  order fails here as it does under the run-time audit; the evidence notes say which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from ...contracts import DistributedUpdate, ParallelPlan
from .attribution import allowed_phases
from .mesh import mesh_kind, run_on_gloo_mesh
from .receipt_check import judge_receipts
from .tolerance import EM_STATISTICS_TOLERANCE, compare
from .worker import gloo_rank_main, run_trials

ByRank = list[list[dict[str, Any]]]
"""Per rank, every (seed, repeat) run: ``{"seed", "repeat", "steps": [{"observables", "collectives", "receipts"}]}``."""


@attrs.frozen
class TrialPlan:
    """What every trial runs: the workload, the plan, the precision, the seeds and the repeats of each."""

    workload: Any
    plan: ParallelPlan
    precision: str
    seeds: tuple[int, ...]
    repeats: int


class Launch(Protocol):
    """One way of running trials; ``GlooMeshLaunch`` and ``SelfLaunch`` are the two."""

    name: str
    """The ``verification_launch`` value it serves."""
    traced: bool
    """True when the harness traces the collectives itself; False when the executor reports them."""
    recorded_as: str
    """The backend whose realizations of a declared kind are accepted (``collectives.realized_kinds``)."""

    def default_workload(self, plan: ParallelPlan) -> str:
        """The built-in workload for ``plan`` when none is given."""
        ...

    def run(self, target: Any, executor: Any, trials: TrialPlan, timeout: float) -> ByRank:
        """Every trial, per rank (``target`` is what ranks resolve; ``executor`` the resolved object)."""
        ...

    def worker_invariance(self, executor: Any, trials: TrialPlan, by_rank: ByRank) -> dict[str, str]:
        """Per update, how the run differs in bits from the same executor on one worker (nothing when not checked)."""
        ...

    def judge_receipts(self, updates: Sequence[DistributedUpdate],
                       by_rank: ByRank) -> tuple[dict[str, list[str]], tuple[str, ...]]:
        """Per update the receipt mismatches, and one measured line per compared step."""
        ...

    def collective_notes(self, update: DistributedUpdate) -> list[str]:
        """Notes on how the update's collectives were attributed."""
        ...

    def closing_notes(self, reported: bool, variant: str | None) -> list[str]:
        """Notes the evidence ends with (how collectives were counted, the one-worker comparison)."""
        ...

    def mesh_kind(self, executor: Any, world_size: int) -> tuple[str, str]:
        """(device kind, communication backend) the run was measured on, as certificates record them."""
        ...


class GlooMeshLaunch:
    """The harness spawns the ranks and traces every collective (``verification_launch = "gloo"``)."""

    name = "gloo"
    traced = True
    recorded_as = "gloo"

    def default_workload(self, plan: ParallelPlan) -> str:
        """The mixture of experts for expert parallelism, the bidirectional attention LM for context
        parallelism, else the MLP."""
        if plan.ep > 1:
            return "moe"
        return "attention" if plan.cp > 1 else "mlp"

    def run(self, target: Any, executor: Any, trials: TrialPlan, timeout: float) -> ByRank:
        """``plan.world_size`` fresh ranks, each resolving ``target`` and running every trial traced."""
        return run_on_gloo_mesh(gloo_rank_main, trials.plan.world_size, target, trials.workload, trials.plan,
                                trials.precision, list(trials.seeds), trials.repeats, timeout=timeout)

    def worker_invariance(self, executor: Any, trials: TrialPlan, by_rank: ByRank) -> dict[str, str]:
        """Not checked: every rank is one worker of the mesh the plan names."""
        return {}

    def judge_receipts(self, updates: Sequence[DistributedUpdate],
                       by_rank: ByRank) -> tuple[dict[str, list[str]], tuple[str, ...]]:
        """Each step's receipts against the flight recorder's entries (``receipt_check.judge_receipts``)."""
        return judge_receipts(updates, by_rank, backend=self.recorded_as)

    def collective_notes(self, update: DistributedUpdate) -> list[str]:
        """The phases the update's entries were attributed in."""
        return [f"attributed by phase ({', '.join(sorted(allowed_phases(update)))})"]

    def closing_notes(self, reported: bool, variant: str | None) -> list[str]:
        """Nothing more: the trace is the harness's own."""
        return []

    def mesh_kind(self, executor: Any, world_size: int) -> tuple[str, str]:
        """What the harness mesh of ``world_size`` ranks runs on (``mesh.mesh_kind``)."""
        return mesh_kind(world_size)


class SelfLaunch:
    """The executor starts its own workers; trials run in this process (``verification_launch = "self"``)."""

    name = "self"
    traced = False
    recorded_as = "self"

    def default_workload(self, plan: ParallelPlan) -> str:
        """EM's Gaussian mixture."""
        return "gaussian_mixture"

    def run(self, target: Any, executor: Any, trials: TrialPlan, timeout: float) -> ByRank:
        """One 'rank': this process, with the plan's world of workers the executor starts."""
        return [run_trials(executor, trials.workload, trials.plan, precision=trials.precision, seeds=trials.seeds,
                           repeats=trials.repeats, rank=0, world_size=trials.plan.world_size, trace=False)]

    def worker_invariance(self, executor: Any, trials: TrialPlan, by_rank: ByRank) -> dict[str, str]:
        """Per update, where the run on the plan differs in bits from the fixed fold order (the executor's
        ``same_bits_reference()``, one process) or from the same executor on one worker."""
        plan = trials.plan
        found: dict[str, str] = {}
        reference = same_bits_reference(executor)
        if reference is not None:
            _first_differences(found, trials, by_rank, _one_process(reference, trials),
                               f"differs in bits from the fixed fold order ({reference.capabilities.name} in one "
                               "process), which this executor claims to reproduce")
        if plan.world_size > 1:
            _first_differences(found, trials, by_rank, _one_process(executor, trials),
                               f"with {plan.world_size} workers differs in bits from 1 worker")
        return found

    def judge_receipts(self, updates: Sequence[DistributedUpdate],
                       by_rank: ByRank) -> tuple[dict[str, list[str]], tuple[str, ...]]:
        """Not judged: there is no trace of the workers' traffic to hold receipts against."""
        return {}, ()

    def collective_notes(self, update: DistributedUpdate) -> list[str]:
        """None: self-reported collectives carry no phase."""
        return []

    def closing_notes(self, reported: bool, variant: str | None) -> list[str]:
        """That the counts are self-reported, and whether the run is bitwise the one-worker run."""
        notes = (["collective counts self-reported by the executor's trial (EM: counted at the backend's transport)"]
                 if reported else [])
        notes.append("bitwise equal to the same executor on one worker" if variant is None else
                     "NOT bitwise equal to the bits it claims (the note above says which)")
        return notes

    def mesh_kind(self, executor: Any, world_size: int) -> tuple[str, str]:
        """The CPU, and the transport the executor names in ``comm_backend``."""
        return "cpu", str(getattr(executor, "comm_backend", "gloo"))


def same_bits_reference(executor: Any) -> Any:
    """The executor whose one-process run is the fixed fold order ``executor`` claims to reproduce bit for bit
    (``executor.same_bits_reference()``: every EM backend claims the bits of one process), or None (no such claim,
    or the executor is that reference itself)."""
    claim = getattr(executor, "same_bits_reference", None)
    if not callable(claim):
        return None
    reference = claim()
    if reference is None or reference.capabilities.name == executor.capabilities.name:
        return None
    return reference


def _one_process(executor: Any, trials: TrialPlan) -> dict[int, list[dict[str, Any]]]:
    """Per seed, the steps of ``executor`` run once on one worker in this process."""
    single = run_trials(executor, trials.workload, ParallelPlan(), precision=trials.precision,
                        seeds=trials.seeds, repeats=1, rank=0, world_size=1, trace=False)
    return {run["seed"]: run["steps"] for run in single}


def _first_differences(found: dict[str, str], trials: TrialPlan, by_rank: ByRank,
                       expected: dict[int, list[dict[str, Any]]], what: str) -> None:
    """Note in ``found``, per update not yet noted, the first observable of the run that is not bitwise ``expected``."""
    for run in by_rank[0]:
        if run["repeat"]:
            continue
        for step, (ours, theirs) in enumerate(zip(run["steps"], expected[run["seed"]])):
            for node, values in ours["observables"].items():
                for key, value in sorted(values.items()):
                    other = theirs["observables"].get(node, {}).get(key)
                    if node not in found and (other is None
                                              or not compare(value, other, EM_STATISTICS_TOLERANCE).within):
                        found[node] = f"{key} at step {step} (seed {run['seed']}) {what}"


LAUNCHES: dict[str, Launch] = {"gloo": GlooMeshLaunch(), "self": SelfLaunch()}
"""The strategy of each ``verification_launch`` value."""


def launch_for(executor: Any) -> Launch:
    """The strategy for ``executor``'s ``verification_launch`` (``"gloo"`` when it names none)."""
    name = getattr(executor, "verification_launch", "gloo")
    try:
        return LAUNCHES[name]
    except (KeyError, TypeError):
        raise ValueError(f"{executor.capabilities.name}.verification_launch={name!r}; expected "
                         f"{' or '.join(repr(k) for k in LAUNCHES)}") from None
