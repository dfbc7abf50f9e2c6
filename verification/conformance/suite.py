"""The conformance suite: standard contract and executor checks any backend must pass.

Run it with ``mixle-parallel conformance --backend module:attr`` (``main_conformance``) or
``pytest --mixle-backend module:attr`` (the pytest plugin in ``conformance.plugin``). Each
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

from mixle_parallel.contracts import (
    PHYSICAL_AXES,
    BackendCapabilities,
    CapabilityError,
    DistributedUpdate,
    ParallelPlan,
    VerifiableExecutor,
    from_json,
    to_json,
)
from mixle_parallel.verification.admission import require_admission
from mixle_parallel.verification.harness.run import verify
from mixle_parallel.verification.harness.worker import resolve_executor
from mixle_parallel.verification.keys import TrustStore


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


def check_identity(ctx: ConformanceContext) -> None:
    """The backend has BackendCapabilities and a non-empty version string."""
    backend = ctx.executor()
    caps = getattr(backend, "capabilities", None)
    if not isinstance(caps, BackendCapabilities):
        raise ConformanceFailure(f"capabilities must be a BackendCapabilities, got {type(caps).__name__}")
    version = getattr(backend, "version", None)
    if not isinstance(version, str) or not version.strip():
        raise ConformanceFailure(f"version must be a non-empty str, got {version!r}")


def check_capabilities_round_trip(ctx: ConformanceContext) -> None:
    """The capability declaration survives the one converter's JSON round trip unchanged."""
    caps = ctx.executor().capabilities
    again = from_json(to_json(caps), BackendCapabilities)
    if again != caps:
        raise ConformanceFailure(f"capabilities changed in a JSON round trip: {caps!r} -> {again!r}")


def check_rejects_unclaimed_axes(ctx: ConformanceContext) -> None:
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


def check_declared_updates(ctx: ConformanceContext) -> None:
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


def check_verifiable(ctx: ConformanceContext) -> None:
    """The backend implements the harness protocol (contracts.VerifiableExecutor: open_trial)."""
    backend = ctx.executor()
    if not isinstance(backend, VerifiableExecutor):
        raise ConformanceFailure("the backend has no open_trial(workload, plan, *, precision, seed, rank, "
                                 "world_size); see contracts/verifiable.py")
    launch = getattr(backend, "verification_launch", "gloo")
    if launch not in ("gloo", "self"):
        raise ConformanceFailure(f"verification_launch={launch!r}; expected 'gloo' or 'self'")


def check_harness_admits(ctx: ConformanceContext) -> None:
    """On a small real mesh the harness's evidence passes every check and certifies the backend."""
    backend, plan, precision = ctx.executor(), ctx.chosen_plan(), ctx.chosen_precision()
    workload = ctx.workload
    if workload is None:
        workload = "mlp" if getattr(backend, "verification_launch", "gloo") == "gloo" else "gaussian_mixture"
    report = verify(ctx.spec, plan, precision=precision, workload=workload)
    ctx.report = report
    if not report.passed:
        raise ConformanceFailure("verification failed:\n" + report.summary())
    with tempfile.TemporaryDirectory(prefix="mixle-conformance-keys-") as home:
        keys = TrustStore(home)  # a throw-away key: conformance must not touch the user's trust store
        envelope = report.certify(backend, trust_store=keys, store=False)
        require_admission(backend, plan, precision, certificate=envelope, world_size=max(2, plan.world_size),
                          trust_store=keys)


CHECKS: tuple[Callable[[ConformanceContext], None], ...] = (
    check_identity, check_capabilities_round_trip, check_rejects_unclaimed_axes, check_declared_updates,
    check_verifiable, check_harness_admits,
)
"""Every conformance check, cheapest first (the harness check starts processes)."""


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
    """Run every check against the backend ``spec`` (object or 'module:attr'); results in order."""
    ctx = ConformanceContext(spec, plan, precision, workload)
    results = []
    for check in CHECKS:
        if skip_harness and check is check_harness_admits:
            continue
        started, before = time.perf_counter(), ctx.report
        try:
            check(ctx)
            passed, detail = True, ""
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
    """``mixle-parallel conformance --backend module:attr``: run the suite, exit 1 when a check fails."""
    parser = argparse.ArgumentParser(prog="mixle-parallel conformance", description=main_conformance.__doc__)
    parser.add_argument("--backend", required=True, help="the backend as 'package.module:attribute'")
    parser.add_argument("--plan", default=None, help="plan for the harness check, e.g. 'dp_shard=2'")
    parser.add_argument("--precision", default=None, help="precision for the harness check (default fp32)")
    parser.add_argument("--workload", default=None, help="mlp, tiny_lm or gaussian_mixture")
    parser.add_argument("--skip-harness", action="store_true", help="only the contract checks (no processes)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        plan = parse_plan(args.plan)
    except ValueError as exc:
        print(f"mixle-parallel conformance: {exc}", file=sys.stderr)
        return 2
    results = run_conformance(args.backend, plan=plan, precision=args.precision, workload=args.workload,
                              skip_harness=args.skip_harness)
    for result in results:
        print(f"{'PASS' if result.passed else 'FAIL'}  {result.name:<32} {result.seconds:6.1f}s")
        if not result.passed:
            print("      " + result.detail.replace("\n", "\n      "))
    failed = [r.name for r in results if not r.passed]
    failed_note = f"; failed: {', '.join(failed)}" if failed else ""
    print(f"{len(results) - len(failed)}/{len(results)} checks passed{failed_note}")
    return 1 if failed else 0
