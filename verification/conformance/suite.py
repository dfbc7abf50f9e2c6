"""The conformance suite: standard contract and executor checks any backend must pass.

Run it with ``mixle-parallel conformance --backend NAME|module:attr`` (``main_conformance``) or
``pytest --mixle-backend NAME|module:attr`` (the pytest plugin in ``conformance.plugin``); a name is
a registered training or EM backend (``backend_names``). Each
check is a function of a ``ConformanceContext`` that raises ``ConformanceFailure`` with what is
wrong; the last one runs the verification harness on a small real mesh and requires that its
evidence certifies the backend.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ...contracts import (
    PHYSICAL_AXES,
    BackendCapabilities,
    CapabilityError,
    DistributedUpdate,
    ParallelPlan,
    VerifiableExecutor,
    from_json,
    to_json,
)
from ..admission import require_admission
from ..backend_names import add_backend_arguments, harness_target, import_modules
from ..harness.launch import LAUNCHES, launch_for
from ..harness.run import verify
from ..harness.worker import resolve_executor
from ..keys import TrustStore


class ConformanceFailure(AssertionError):
    """A backend broke a conformance check; the message says which rule and how."""


@attrs.define
class ConformanceContext:
    """The backend under test and the plan/precision/workload the harness check uses."""

    spec: Any
    plan: ParallelPlan | None = None
    precision: str | None = None
    workload: Any = None
    backend: Any = None
    report: Any = None

    def executor(self) -> Any:
        """The resolved backend (resolved once)."""
        if self.backend is None:
            self.backend = resolve_executor(self.spec)
        return self.backend

    def chosen_plan(self) -> ParallelPlan:
        """The plan to verify: the given one, or 2 ranks on the first data axis the backend claims."""
        if self.plan is not None:
            return self.plan
        axes = self.executor().capabilities.axes
        for axis in ("dp_shard", "dp_replicate", "tp", "cp", "pp"):
            if axis in {a.value for a in axes}:
                return ParallelPlan(**{axis: 2})
        raise ConformanceFailure(f"capabilities claim no physical axis ({sorted(a.value for a in axes)}); "
                                 "pass --mixle-plan")

    def chosen_precision(self) -> str:
        """The given precision, else fp32 when claimed, else fp64, else the first claimed."""
        if self.precision:
            return self.precision
        claimed = self.executor().capabilities.precisions
        return next((p for p in ("fp32", "fp64") if p in claimed), sorted(claimed)[0])


def check_identity(ctx: ConformanceContext) -> str:
    """The backend has BackendCapabilities and a non-empty version string."""
    backend = ctx.executor()
    caps = getattr(backend, "capabilities", None)
    if not isinstance(caps, BackendCapabilities):
        raise ConformanceFailure(f"capabilities must be a BackendCapabilities, got {type(caps).__name__}")
    version = getattr(backend, "version", None)
    if not isinstance(version, str) or not version.strip():
        raise ConformanceFailure(f"version must be a non-empty str, got {version!r}")
    return f"{caps.name} {version}"


def check_capabilities_round_trip(ctx: ConformanceContext) -> str:
    """The capability declaration survives the one converter's JSON round trip unchanged."""
    caps = ctx.executor().capabilities
    again = from_json(to_json(caps), BackendCapabilities)
    if again != caps:
        raise ConformanceFailure(f"capabilities changed in a JSON round trip: {caps!r} -> {again!r}")
    return f"axes {sorted(a.value for a in caps.axes)}, precisions {sorted(caps.precisions)}: unchanged"


def check_rejects_unclaimed_axes(ctx: ConformanceContext) -> str:
    """validate() refuses, before anything runs, every physical axis the backend does not claim."""
    caps = ctx.executor().capabilities
    for axis in PHYSICAL_AXES:
        if axis in caps.axes:
            continue
        try:
            caps.validate(ParallelPlan(**{axis.value: 2}), ctx.chosen_precision())
        except CapabilityError:
            continue
        raise ConformanceFailure(f"capabilities accept a plan with {axis.value}=2 although the axis is not claimed")
    refused = [a.value for a in PHYSICAL_AXES if a not in caps.axes]
    return f"validate() refused {', '.join(refused) or 'nothing (all claimed)'}"


def check_declared_updates(ctx: ConformanceContext) -> str:
    """describe_updates(plan) returns DistributedUpdates with unique ids over the plan's active axes."""
    backend, plan = ctx.executor(), ctx.chosen_plan()
    updates = tuple(backend.describe_updates(plan))
    if not updates:
        raise ConformanceFailure(f"describe_updates({plan.describe()}) declares nothing")
    ids = [u.node_id for u in updates]
    if len(set(ids)) != len(ids):
        raise ConformanceFailure(f"describe_updates repeats node ids: {ids}")
    active = set(plan.active_axes)
    for update in updates:
        if not isinstance(update, DistributedUpdate):
            raise ConformanceFailure(f"describe_updates returned a {type(update).__name__}, not a DistributedUpdate")
        stray = set(update.mesh_axes) - active
        if stray:
            raise ConformanceFailure(f"update {update.node_id!r} runs over {sorted(a.value for a in stray)}, "
                                     f"which are not active in {plan.describe()}")
        if from_json(to_json(update), DistributedUpdate) != update:
            raise ConformanceFailure(f"update {update.node_id!r} changed in a JSON round trip")
        if update.has_evidence:
            raise ConformanceFailure(f"update {update.node_id!r} claims evidence before any was measured")
    backend.describe_updates(ParallelPlan())  # a single-process plan is always describable
    return f"{plan.describe()}: {', '.join(ids)}"


_PREPARE_STAND_INS: dict[str, Any] = {
    "loss_fn": lambda output, target: output.sum(),
    "activation_shape": (2,),
}
"""Stand-ins for prepare() arguments some backends require (the call must be refused before using them)."""


def _prepare_kwargs(prepare: Any, precision: str) -> dict[str, Any]:
    """Keyword arguments for a refusal probe of ``prepare``: its required keywords from the stand-ins."""
    import inspect

    kwargs: dict[str, Any] = {}
    for name, param in inspect.signature(prepare).parameters.items():
        if name == "precision":
            kwargs[name] = precision
        elif name in _PREPARE_STAND_INS and param.default is inspect.Parameter.empty:
            kwargs[name] = _PREPARE_STAND_INS[name]
    return kwargs


def check_prepare_refuses_unclaimed_axes(ctx: ConformanceContext) -> str:
    """prepare() with a plan on an axis the backend does not claim raises CapabilityError before any process group."""
    backend = ctx.executor()
    prepare = getattr(backend, "prepare", None)
    unclaimed = [a for a in PHYSICAL_AXES if a not in backend.capabilities.axes]
    if prepare is None:
        return "no prepare(): the backend starts its own workers (checked through validate() only)"
    if not unclaimed:
        return "every physical axis is claimed: nothing to refuse"
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise ConformanceFailure("a process group already exists in this process; run conformance in a fresh one")
    for axis in unclaimed:
        plan = ParallelPlan(**{axis.value: 2})
        try:
            prepare(torch.nn.Sequential(torch.nn.Linear(2, 2)), plan=plan,
                    **_prepare_kwargs(prepare, ctx.chosen_precision()))
        except CapabilityError:
            pass
        except Exception as exc:  # noqa: BLE001 - any other failure is the wrong refusal
            raise ConformanceFailure(f"prepare({plan.describe()}) raised {type(exc).__name__}: {exc}; it must raise "
                                     "CapabilityError (capabilities.validate) before anything else") from exc
        else:
            raise ConformanceFailure(f"prepare({plan.describe()}) accepted a plan on unclaimed axis {axis.value}")
        finally:
            created = dist.is_initialized()
            if created:
                dist.destroy_process_group()
        if created:
            raise ConformanceFailure(f"prepare({plan.describe()}) created a process group before refusing")
    return f"refused {', '.join(a.value for a in unclaimed)}=2 with CapabilityError, no process group created"


def check_verifiable(ctx: ConformanceContext) -> str:
    """The backend implements the harness protocol (contracts.VerifiableExecutor: open_trial)."""
    backend = ctx.executor()
    if not isinstance(backend, VerifiableExecutor):
        raise ConformanceFailure("the backend has no open_trial(workload, plan, *, precision, seed, rank, "
                                 "world_size); see contracts/harness_protocol.py")
    launch = getattr(backend, "verification_launch", "gloo")
    if launch not in LAUNCHES:
        raise ConformanceFailure(f"verification_launch={launch!r}; expected {' or '.join(map(repr, LAUNCHES))}")
    return f"open_trial present, verification_launch={launch}"


def check_harness_admits(ctx: ConformanceContext) -> str:
    """On a small real mesh the harness's evidence passes every check and certifies the backend."""
    backend, plan, precision = ctx.executor(), ctx.chosen_plan(), ctx.chosen_precision()
    report = verify(ctx.spec, plan, precision=precision, workload=ctx.workload)
    ctx.report = report
    if not report.passed:
        raise ConformanceFailure("verification failed:\n" + report.summary())
    with tempfile.TemporaryDirectory(prefix="mixle-conformance-keys-") as home:
        keys = TrustStore(home)  # a throw-away key: conformance must not touch the user's trust store
        envelope = report.certify(backend, trust_store=keys, store=False)
        require_admission(backend, plan, precision, certificate=envelope, world_size=max(2, plan.world_size),
                          trust_store=keys)
    worst = max(report.evidence, key=lambda e: e.maximum_relative_error)
    return (f"{plan.describe()} at {precision}, workload {report.workload}: {len(report.evidence)} updates within "
            f"bounds (worst {worst.node_id}: abs {worst.maximum_absolute_error:.2g}, rel "
            f"{worst.maximum_relative_error:.2g}), deterministic, collectives as declared; certified")


def _harness_report(ctx: ConformanceContext) -> Any:
    """The harness's report for the context (the one ``check_harness_admits`` made, else a fresh run)."""
    if ctx.report is None:
        ctx.report = verify(ctx.spec, ctx.chosen_plan(), precision=ctx.chosen_precision(), workload=ctx.workload)
    return ctx.report


def check_receipts_match_observed(ctx: ConformanceContext) -> str:
    """Every step's receipts report the collective counts and bytes the flight recorder saw in that step."""
    report = _harness_report(ctx)
    bad = [f for f in report.failures if "check 'receipts'" in f]
    if bad:
        raise ConformanceFailure("\n".join([*bad, *report.receipts[:4]]))
    if not report.receipts:
        return "the backend's trials report no receipts (trial.receipts()) or no traced collectives: nothing to compare"
    return f"{len(report.receipts)} steps' receipts match the flight recorder (counts exact, bytes within 5%); " \
           f"e.g. {report.receipts[-1]}"


def check_updates_on_the_wire(ctx: ConformanceContext) -> str:
    """Each declared update's collective was seen on the wire in its own phase, and nothing undeclared was."""
    report = _harness_report(ctx)
    bad = [f for f in report.failures if "check 'collectives'" in f]
    if bad:
        raise ConformanceFailure("\n".join(bad))
    seen = [f"{e.node_id}: " + (", ".join(f"{c.kind.value} x{c.count}" for c in e.collectives_observed) or "none")
            for e in report.evidence]
    how = "attributed by phase" if launch_for(ctx.executor()).traced else "self-reported by the executor"
    return "; ".join(seen) + f" (per rank, {how})"


CHECKS: tuple[Callable[[ConformanceContext], Any], ...] = (
    check_identity, check_capabilities_round_trip, check_rejects_unclaimed_axes, check_prepare_refuses_unclaimed_axes,
    check_declared_updates, check_verifiable, check_harness_admits, check_receipts_match_observed,
    check_updates_on_the_wire,
)
"""Every conformance check, cheapest first (the harness check starts processes; the last two read its report)."""

HARNESS_CHECKS: tuple[Callable[[ConformanceContext], Any], ...] = (
    check_harness_admits, check_receipts_match_observed, check_updates_on_the_wire,
)
"""The checks that need the harness's run on a real mesh (left out by ``skip_harness``)."""


@attrs.frozen
class CheckResult:
    """One check's outcome; ``report`` is the harness's VerificationReport for the check that ran it."""

    name: str
    passed: bool
    detail: str
    seconds: float
    report: Any = None


def run_conformance(spec: Any, *, plan: ParallelPlan | None = None, precision: str | None = None,
                    workload: Any = None, skip_harness: bool = False) -> tuple[CheckResult, ...]:
    """Run every check against the backend ``spec`` (object, 'module:attr' or registered name); results in order."""
    ctx = ConformanceContext(spec, plan, precision, workload)
    results = []
    for check in CHECKS:
        if skip_harness and check in HARNESS_CHECKS:
            continue
        started, before = time.perf_counter(), ctx.report
        try:
            measured = check(ctx)
            passed, detail = True, str(measured or "")
        except Exception as exc:  # noqa: BLE001 - every failure is reported, not raised
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        report = ctx.report if ctx.report is not before else None
        results.append(CheckResult(check.__name__, passed, detail, time.perf_counter() - started, report))
    return tuple(results)


def parse_plan(text: str | None) -> ParallelPlan | None:
    """``"dp_shard=2,tp=2"`` -> ParallelPlan; None for None/empty."""
    if not text:
        return None
    sizes = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise ValueError(f"plan item {item!r} must look like axis=size, e.g. dp_shard=2")
        sizes[key.strip()] = int(value)
    return ParallelPlan.from_mapping(sizes)


def main_conformance(argv: Sequence[str] | None = None) -> int:
    """``mixle-parallel conformance --backend NAME|module:attr``: run the suite, exit 1 when a check fails."""
    parser = argparse.ArgumentParser(prog="mixle-parallel conformance", description=main_conformance.__doc__)
    add_backend_arguments(parser)
    parser.add_argument("--plan", default=None, help="plan for the harness check, e.g. 'dp_shard=2'")
    parser.add_argument("--precision", default=None, help="precision for the harness check (default fp32)")
    parser.add_argument("--workload", default=None, help="mlp, tiny_lm or gaussian_mixture")
    parser.add_argument("--skip-harness", action="store_true", help="only the contract checks (no processes)")
    parser.add_argument("--junit-xml", default=None, help="also write the results as a JUnit XML report here")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        plan = parse_plan(args.plan)
        import_modules(args.imports)
        spec = harness_target(args.backend)
    except ValueError as exc:  # an UnknownBackendError is one too
        print(f"mixle-parallel conformance: {exc}", file=sys.stderr)
        return 2
    results = run_conformance(spec, plan=plan, precision=args.precision, workload=args.workload,
                              skip_harness=args.skip_harness)
    for result in results:
        first, _, rest = result.detail.partition("\n")
        print(f"{'PASS' if result.passed else 'FAIL'}  {result.name:<38} {result.seconds:6.1f}s  {first}")
        if rest:
            print("      " + rest.replace("\n", "\n      "))
    if args.junit_xml:
        from pathlib import Path

        from .junit import junit_xml

        Path(args.junit_xml).write_text(junit_xml(results, backend=args.backend), encoding="utf-8")
    failed = [r.name for r in results if not r.passed]
    failed_note = f"; failed: {', '.join(failed)}" if failed else ""
    print(f"{len(results) - len(failed)}/{len(results)} checks passed{failed_note}")
    return 1 if failed else 0
