"""In-situ certification: a launched run certifies on the process group it is already in, before its first step.

``certify_in_situ(request)`` runs on every rank of the default process group (torchrun, mpiexec or any
launcher made it): each rank runs the harness's reference workload for the plan family through the
executor (``harness.worker.run_trials``, collectives traced by the flight recorder), then the
executor's probe of the user's own module; rank 0 gathers everything, judges it against the
workload's independent single-process reference exactly as ``verify`` does (``harness.judge``), and
signs a certificate with its own key (``certify``; the trust store's policy decides whether a key
may be made). The signed envelope (or the reasons it was refused) is broadcast as JSON, so every
rank gets the same answer; the gate (``admission.require_admission``) then checks it on every rank
and stores it for the next run. No process starts: the run's own ranks are the mesh.

The trials and the probe are admitted by this module's harness capability (``capability``), never by
the environment; the random state and torch's deterministic-algorithm setting of the user's process are
restored afterwards.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from ..contracts import (
    CertificateEnvelope,
    InSituMeasurement,
    ParallelPlan,
    UnusedParametersError,
    from_json,
    to_json,
)
from ..contracts.bounded_json import SIGNED_LIMITS
from .capability import claim_harness_capability, harness_admitted
from .certification import CertificationError, certify
from .harness.judge import Measured, judge_update, judge_wire
from .harness.launch import GlooMeshLaunch, Launch, SelfLaunch
from .harness.tolerance import default_tolerance
from .harness.window import measured_window
from .harness.worker import run_trials
from .harness.workloads import resolve_workload
from .keys import TrustStore, TrustStoreError

__all__ = ["FR_BUFFER_ENV", "CommGroup", "InSituRequest", "ProbeOutcome", "TorchGroup", "certify_in_situ"]

_IN_SITU = claim_harness_capability("mixle_parallel.verification.in_situ")
"""This module's capability: the in-situ trials and probe pass the gate in mode ``verifying`` under it."""

FR_BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_SIZE = "20000"
"""The flight recorder's buffer the in-situ trials trace with (what the harness's own meshes set); a value the
user set is kept (``0`` turns tracing off, and in-situ certification then fails saying so)."""

SEEDS = (0,)
"""One seed, two repeats (determinism) of the reference workload: the cost stays a few seconds."""


@attrs.frozen
class ProbeOutcome:
    """What the probe of the user's own module found on this rank (rank 0's verdict is the one recorded)."""

    outcome: str
    """``passed``, ``failed``, ``skipped`` or ``not_applicable``."""
    reason: str
    max_abs_error: float | None = None


Probe = Callable[[], ProbeOutcome]


@attrs.frozen(kw_only=True)
class InSituRequest:
    """What to certify in situ: the executor under the harness protocol, the run's plan and where it runs."""

    executor: Any
    """A ``contracts.VerifiableExecutor`` whose identity is the run's executor (e.g. ``VerifiableTorchNative``)."""
    plan: ParallelPlan
    precision: str
    device_kind: str
    comm_backend: str
    launcher: str = "launched"
    probe: Probe | None = None
    """Runs on every rank after the workload; None: there is no user module to probe (EM)."""
    trust_store: TrustStore | None = None
    workload: Any = None
    """The reference workload (default: the harness's one for the plan family)."""
    group: Any = None
    """The run's ranks: a ``TorchGroup`` (default: torch's default process group) or a ``CommGroup`` (MPI)."""
    traced: bool = True
    """True: collectives traced by the flight recorder (training); False: reported by the trials (EM)."""


class TorchGroup:
    """torch.distributed's default process group: the ranks of a torchrun (or any launcher's) job."""

    def __init__(self) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise CertificationError("in-situ certification needs the run's process group; none is initialized")
        self._dist = dist
        self.rank, self.size = int(dist.get_rank()), int(dist.get_world_size())

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on rank 0 (None elsewhere)."""
        out: list[Any] | None = [None] * self.size if self.rank == 0 else None
        self._dist.gather_object(value, out, dst=0)
        return out

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        box = [value]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]


class CommGroup:
    """An MPI communicator (mpi4py's ``COMM_WORLD`` by default): the ranks of an ``mpiexec`` job."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank, self.size = int(comm.Get_rank()), int(comm.Get_size())

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on rank 0 (None elsewhere)."""
        found = self.comm.gather(value, root=0)
        return list(found) if found is not None else None

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        return self.comm.bcast(value, root=0)


class InSituSelfReported(SelfLaunch):
    """EM in situ: collectives reported by the trials; the one-worker comparison is not run (the ranks are the
    job's), and the evidence says so instead of claiming it."""

    def closing_notes(self, reported: bool, variant: str | None) -> list[str]:
        """That the counts are self-reported and that no one-worker comparison ran."""
        notes = ["collective counts self-reported by the executor"] if reported else []
        return [*notes, "measured in situ on the job's ranks: no comparison with one worker"]


def _launch(request: InSituRequest) -> Launch:
    return GlooMeshLaunch() if request.traced else InSituSelfReported()


@contextlib.contextmanager
def _user_state_kept(device_kind: str) -> Iterator[None]:
    """Restore the process's torch random state and deterministic-algorithm setting after the training trials
    (EM trials draw from their own seeded numpy generators and need no torch)."""
    import torch

    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    devices = [torch.cuda.current_device()] if device_kind == "cuda" and torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def _phase(rank: int, started: float, text: str) -> None:
    """One progress line on rank 0's stderr (the other ranks run the same phases in step and say nothing)."""
    if rank == 0:
        print(f"mixle-parallel: in situ [{time.perf_counter() - started:5.1f} s] {text}", file=sys.stderr, flush=True)


def _on_this_rank(request: InSituRequest, work: Any, rank: int, world: int, started: float) -> dict[str, Any]:
    """This rank's trials and probe; a local failure is reported, never raised (every rank reaches the gather)."""
    found: dict[str, Any] = {"runs": None, "problem": None, "probe": None, "unused": None}
    kept = _user_state_kept(request.device_kind) if request.traced else contextlib.nullcontext()
    with kept, harness_admitted(_IN_SITU):
        _phase(rank, started, f"1/3 the reference workload {work.name!r} on {world} ranks")
        try:
            found["runs"] = run_trials(request.executor, work, request.plan, precision=request.precision,
                                       seeds=SEEDS, repeats=2, rank=rank, world_size=world, trace=request.traced)
        except Exception:  # noqa: BLE001 - sent to rank 0, which refuses naming it
            found["problem"] = f"rank {rank}: the reference workload failed:\n{traceback.format_exc()}"
        if request.probe is not None and found["problem"] is None:
            _phase(rank, started, "2/3 the probe of your module (a copy) against a one-rank recomputation")
            try:
                found["probe"] = request.probe()
            except UnusedParametersError as exc:  # the user's module, not the executor: raised as itself below
                found["unused"] = list(exc.names)
            except Exception:  # noqa: BLE001 - as above
                found["problem"] = f"rank {rank}: the probe of the module failed:\n{traceback.format_exc()}"
    return found


def _judge(request: InSituRequest, work: Any, gathered: Sequence[dict[str, Any]]) -> tuple[list[Any], list[str]]:
    """Rank 0: the evidence per declared update and every failure, as ``verify`` judges a harness mesh."""
    problems = [g["problem"] for g in gathered if g["problem"]]
    if problems:
        return [], problems
    plan, precision = request.plan, request.precision
    launch = _launch(request)
    updates = tuple(request.executor.describe_updates(plan))
    by_rank = [g["runs"] for g in gathered]
    tolerance = default_tolerance(precision, family="training" if hasattr(work, "build_module") else "em")
    reference = {seed: work.reference(seed, precision) for seed in SEEDS}  # never the executor itself
    measured = Measured(by_rank, reference, tolerance, plan, precision, len(SEEDS),
                        request.executor.capabilities.name, {})
    wire = judge_wire(updates, by_rank, plan, launch, first_step=1 if work.steps > 1 else 0)
    verdicts = [judge_update(update, measured, wire, launch) for update in updates]
    failures = [*wire.failures, *(f for v in verdicts for f in v.failures)]
    evidence = [v.evidence for v in verdicts if v.evidence is not None]
    failures += [f"update {e.node_id!r}: evidence did not pass" for e in evidence if not e.passed]
    return evidence, failures


def _probe_verdict(gathered: Sequence[dict[str, Any]], has_probe: bool) -> tuple[ProbeOutcome, list[str]]:
    """Rank 0's probe outcome, and a failure when it failed."""
    if not has_probe:
        return ProbeOutcome("not_applicable", "no user module: the executor's reference workload is the model"), []
    outcome = gathered[0]["probe"]
    if not isinstance(outcome, ProbeOutcome):
        return ProbeOutcome("skipped", "no probe outcome"), ["the probe of the module returned no outcome"]
    if outcome.outcome == "failed":
        return outcome, [f"check 'probe' failed: the executor's gradients of the module differ from a one-rank "
                         f"recomputation: {outcome.reason}"]
    return outcome, []


def _sign(request: InSituRequest, work: Any, gathered: Sequence[dict[str, Any]], started: float) -> tuple[str, str]:
    """Rank 0: ("ok", envelope JSON) or ("refused", the reasons)."""
    evidence, failures = _judge(request, work, gathered)
    probe, probe_failures = _probe_verdict(gathered, request.probe is not None)
    failures += probe_failures
    name = request.executor.capabilities.name
    if failures:
        return "refused", (f"in-situ certification of {name} on {request.plan.describe()} failed: "
                           + "; ".join(failures))
    measurement = InSituMeasurement(
        launcher=request.launcher, world_size=request.plan.world_size, workload=str(work.name),
        probe=probe.outcome, probe_reason=probe.reason,
        probe_max_abs_error=probe.max_abs_error if probe.outcome == "passed" else None,
        seconds=round(time.perf_counter() - started, 3))
    try:
        envelope = certify(evidence, executor=request.executor, plan=request.plan, precision=request.precision,
                           device_kind=request.device_kind, comm_backend=request.comm_backend,
                           trust_store=request.trust_store, store=False, measurement=measurement)
    except (CertificationError, TrustStoreError) as exc:
        return "refused", str(exc)
    return "ok", to_json(envelope)


def _signed_or_refused(request: InSituRequest, work: Any, gathered: Sequence[dict[str, Any]],
                       started: float) -> tuple[str, str]:
    """Rank 0's answer; an error while judging is an answer too (the other ranks wait in the broadcast)."""
    try:
        return _sign(request, work, gathered, started)
    except Exception:  # noqa: BLE001 - refused on every rank, with the traceback
        return "refused", f"judging the in-situ measurement failed on rank 0:\n{traceback.format_exc()}"


def certify_in_situ(request: InSituRequest) -> CertificateEnvelope:
    """On every rank of the run's process group: the same signed envelope everywhere, or ``CertificationError``
    (raised on every rank with rank 0's reasons). Call it on all ranks together, before the first step."""
    group = request.group if request.group is not None else TorchGroup()
    rank, world = group.rank, group.size
    plan = request.plan
    if world != plan.world_size:
        raise CertificationError(f"in-situ certification of {plan.describe()} needs {plan.world_size} ranks; the "
                                 f"process group has {world}")
    if request.traced:  # the flight recorder reads it lazily: set before the trials' first collective suffices
        os.environ.setdefault(FR_BUFFER_ENV, FR_BUFFER_SIZE)
    started = time.perf_counter()
    # every data-parallel certification measures an accumulation window, here as in ``verify``
    plan, work = measured_window(plan, resolve_workload(request.workload or _launch(request).default_workload(plan)))
    request = attrs.evolve(request, plan=plan)
    local = _on_this_rank(request, work, rank, world, started)
    gathered = group.gather(local)
    unused = next((g["unused"] for g in gathered or () if g.get("unused")), None)
    if unused is not None:  # rank 0 says so to every rank: the module needs an option, not a certificate
        message: tuple[str, str] | None = ("unused_parameters", "\n".join(unused))
    else:
        _phase(rank, started, "3/3 judging the evidence and signing on rank 0")
        message = _signed_or_refused(request, work, gathered, started) if rank == 0 and gathered is not None else None
    kind, text = group.broadcast(message)
    if kind == "unused_parameters":
        raise UnusedParametersError(text.split("\n"), where="a probe step of the module")
    _phase(rank, started, "certified" if kind == "ok" else "refused")
    if kind != "ok":
        raise CertificationError(text)
    return from_json(text, CertificateEnvelope, limits=SIGNED_LIMITS)

