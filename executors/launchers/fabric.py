"""LightningFabricLauncher: Lightning Fabric for pure DDP or FSDP jobs, each rank bound to its plan coordinate.

Fabric is capability-gated to data parallelism: a plan with a model axis (tp, pp, cp, ep, etp)
is rejected when the launcher is built, before lightning is imported, because Fabric would
accept and silently drop it. Those axes belong to the torch_native DeviceMesh or the megatron
backend (under :class:`TorchrunLauncher` or :class:`RayTrainLauncher`).

``launch(fn, ...)`` starts the ranks with Fabric's own launcher (``ddp``/``fsdp`` re-run the
calling script once per extra rank), and on every rank binds the attestation from Fabric's
``global_rank``/``world_size`` and the live process group before calling ``fn(context, ...)``.
The process group is destroyed when ``fn`` returns or raises on that rank (without that Fabric's
spawned ranks abort at interpreter exit), and the launching rank waits for the ranks it started
and raises if one of them failed.

``launch`` (and mixle's ``create``) first pass the plan through the admission gate
(``launchers.admission.admit_launch``) for the training backend the launched function runs
(``backend=``, ``torch_native`` by default), with ``admission=``/``certificate=``: a refused plan
starts no rank. Each rank's context carries the decision (``context.admission``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...contracts import (
    BackendCapabilities,
    CapabilityError,
    MissingExtraError,
    ParallelAxis,
    ParallelPlan,
    WorkerTopologyAttestation,
)
from ...verification.admission import AdmissionDecision
from .admission import admit_launch, launch_device_kind
from .base import LaunchContext, bind_launched_rank, release_process_group

LAUNCHER = "lightning_fabric"

A = ParallelAxis
CAPABILITIES = BackendCapabilities(
    name=LAUNCHER,
    axes=frozenset({A.DP_REPLICATE, A.DP_SHARD}),
    # Fabric's precision plugins act only through fabric.setup(); a torch_native session inside
    # sets its own precision. The launcher claims the one it is tested with.
    precisions=frozenset({"fp32"}),
    requirements=("lightning>=2.2", "torch>=2.6"),
    # HSDP through Fabric (FSDPStrategy HYBRID_SHARD) is not exercised by any test: refused
    incompatible_axis_sets=(frozenset({A.DP_REPLICATE, A.DP_SHARD}),),
)


FABRIC_PRECISIONS: dict[object, str] = {
    "32-true": "fp32", "32": "fp32", 32: "fp32",
    "64-true": "fp64", "64": "fp64", 64: "fp64",
    "bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16",
    "16-mixed": "fp16", "16-true": "fp16", "16": "fp16", 16: "fp16",
    "transformer-engine": "fp8", "transformer-engine-float16": "fp8",
}
"""Fabric's precision names (``Fabric(precision=...)``) and the precision each one computes in."""


def fabric_strategy(plan: ParallelPlan) -> str:
    """The Fabric strategy name for a data-parallel plan: ``ddp`` (replicated) or ``fsdp`` (sharded)."""
    problems = CAPABILITIES.problems(plan)
    if problems:
        raise CapabilityError(
            "LightningFabricLauncher only owns data parallelism (DDP or FSDP): " + "; ".join(problems)
            + ". Run model axes with a torch_native or megatron session under TorchrunLauncher or RayTrainLauncher"
        )
    return "fsdp" if plan.dp_shard > 1 else "ddp"


def check_fabric_options(plan: ParallelPlan, *, accelerator: Any, num_nodes: Any, precision: Any,
                         strategy: Any) -> str:
    """The launcher's checks, the same for ``LightningFabricLauncher(plan, ...)`` and ``create(plan=, ...)``;
    returns the strategy the plan derives.

    The plan must be pure data parallelism; ``num_nodes`` divides its world size; ``precision`` is a
    Fabric name for a precision the launcher claims (fp32: ``'32-true'``); ``strategy`` is None or the
    one the plan derives (``'ddp'`` for dp_replicate, ``'fsdp'`` for dp_shard); a sharded plan needs a GPU.
    """
    derived = fabric_strategy(plan)
    _check_num_nodes(plan, num_nodes)
    _check_precision(precision)
    if strategy is not None and strategy != derived:
        raise ValueError(
            f"strategy={strategy!r} is refused by LightningFabricLauncher: the strategy is derived from the plan "
            f"({derived!r} for {plan.describe()}; 'ddp' for dp_replicate, 'fsdp' for dp_shard). Pass strategy=None "
            f"or {derived!r}; for another composition run a torch_native session under TorchrunLauncher or "
            "RayTrainLauncher")
    if derived == "fsdp" and accelerator == "cpu":
        raise ValueError(
            f"plan {plan.describe()} shards parameters, and Fabric runs FSDP only on GPUs; pass "
            "accelerator='gpu', or run a torch_native session (FSDP2 on CPU) under TorchrunLauncher or "
            "RayTrainLauncher"
        )
    return derived


def _check_precision(precision: Any) -> None:
    """Refuse a Fabric precision the launcher does not claim (CAPABILITIES.precisions), naming the option."""
    try:
        ours = FABRIC_PRECISIONS.get(precision)
    except TypeError:  # unhashable
        ours = None
    if ours is None:
        raise ValueError(f"precision={precision!r} is not a Fabric precision name; LightningFabricLauncher "
                         "runs at '32-true' (fp32)")
    if ours not in CAPABILITIES.precisions:
        raise CapabilityError(
            f"precision={precision!r} ({ours}) is refused by LightningFabricLauncher, which claims "
            f"{', '.join(sorted(CAPABILITIES.precisions))} only (precision='32-true'): Fabric's precision acts only "
            "through fabric.setup(). Set the precision of the session inside the launched function instead "
            f"(get_training_backend('torch_native').prepare(..., precision='{ours}'); torch_native honours "
            "fp32, bf16 and fp16)")


class LightningFabricLauncher:
    """Create Fabric for pure DDP or FSDP jobs and launch ``fn(context)`` on every plan rank."""

    def __init__(
        self,
        plan: ParallelPlan | None = None,
        *,
        accelerator: str = "cpu",
        num_nodes: int = 1,
        child_timeout_s: float = 600.0,
        backend: str = "torch_native",
        admission: Any = None,
        certificate: Any = None,
        **fabric_kwargs: Any,
    ) -> None:
        self.child_timeout_s = child_timeout_s
        self.backend, self.admission, self.certificate = backend, admission, certificate
        self.plan: ParallelPlan | None = None
        if plan is None:  # mixle's form: LightningFabricLauncher().create(plan=...)
            if fabric_kwargs or num_nodes != 1 or accelerator != "cpu":
                raise TypeError("pass a plan with launch options, or call create(plan=..., ...) on a bare launcher")
            return
        if not isinstance(plan, ParallelPlan):
            raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
        if "devices" in fabric_kwargs:
            raise ValueError(f"devices is derived from the plan (world size / num_nodes); do not pass "
                             f"devices={fabric_kwargs['devices']!r}")
        # the gate runs here, before anything imports lightning
        self.strategy = check_fabric_options(
            plan, accelerator=accelerator, num_nodes=num_nodes, precision=fabric_kwargs.get("precision", "32-true"),
            strategy=fabric_kwargs.pop("strategy", None))
        self.plan, self.accelerator, self.num_nodes = plan, accelerator, num_nodes
        self.fabric_kwargs = fabric_kwargs

    def create(
        self,
        *,
        plan: ParallelPlan,
        accelerator: str = "auto",
        devices: int | str = "auto",
        num_nodes: int = 1,
        precision: str = "32-true",
        strategy: Any = None,
        backend: str | None = None,
        admission: Any = None,
        certificate: Any = None,
        **kwargs: Any,
    ) -> TopologyBoundFabric:
        """mixle's form: a Fabric for ``plan`` whose ``launch`` binds each rank.

        ``plan``, ``num_nodes``, ``precision`` and ``strategy`` pass the launcher's own checks first
        (:func:`check_fabric_options`: DDP/FSDP only, fp32, the plan's strategy). ``devices`` is per node
        ('auto': the plan's world size on one node). Then the admission gate, before lightning is imported,
        for ``backend`` (default: the launcher's) with ``admission``/``certificate`` (default: the launcher's).
        The returned object forwards every other attribute to Fabric.
        """
        if not isinstance(plan, ParallelPlan):
            raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
        derived = check_fabric_options(plan, accelerator=accelerator, num_nodes=num_nodes, precision=precision,
                                       strategy=strategy)
        if devices == "auto":
            if num_nodes != 1:
                raise ValueError("a multi-node launch needs an explicit per-node device count (devices=...)")
            devices = plan.world_size
        if isinstance(devices, bool) or not isinstance(devices, int) or devices * num_nodes != plan.world_size:
            raise ValueError(
                f"devices={devices!r} x num_nodes={num_nodes} must equal plan.world_size={plan.world_size}"
            )
        decision = self._admit(plan, accelerator, precision, backend=backend, admission=admission,
                               certificate=certificate)
        try:
            from lightning.fabric import Fabric
        except ImportError as err:
            raise MissingExtraError("lightning", "lightning") from err
        fabric = Fabric(accelerator=accelerator, devices=devices, num_nodes=num_nodes,
                        precision=precision,  # type: ignore[arg-type]  # a name checked above
                        strategy=_one_rank_auto(plan, derived), **kwargs)
        return TopologyBoundFabric(fabric, plan, child_timeout_s=self.child_timeout_s, admission=decision)

    def _admit(self, plan: ParallelPlan, accelerator: Any, precision: Any, *, backend: str | None = None,
               admission: Any = None, certificate: Any = None) -> AdmissionDecision:
        """The launch gate for ``plan`` (arguments left None take the launcher's own)."""
        return admit_launch(
            plan, launcher=LAUNCHER, backend=backend or self.backend, precision=FABRIC_PRECISIONS[precision],
            device_kind=launch_device_kind(accelerator),
            admission=self.admission if admission is None else admission,
            certificate=self.certificate if certificate is None else certificate)

    @property
    def devices(self) -> int:
        """Processes Fabric starts on each node."""
        return self._plan().world_size // self.num_nodes

    def _plan(self) -> ParallelPlan:
        if self.plan is None:
            raise TypeError("this launcher was built without a plan; use create(plan=...) or pass the plan")
        return self.plan

    def fabric(self) -> Any:
        """A ``lightning.fabric.Fabric`` for the plan (imports lightning)."""
        try:
            from lightning.fabric import Fabric
        except ImportError as err:
            raise MissingExtraError("lightning", "lightning") from err
        return Fabric(
            accelerator=self.accelerator,
            devices=self.devices,
            num_nodes=self.num_nodes,
            strategy=_one_rank_auto(self._plan(), self.strategy),
            **self.fabric_kwargs,
        )

    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(context, *args, **kwargs)`` on every rank; return this rank's result.

        With Fabric's ``ddp``/``fsdp`` launcher the calling script is re-executed for every
        other rank, which returns from this call too: guard code after it with
        ``context.is_logging_rank`` or write per-rank output.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable as fn(context, ...), got {fn!r}")
        plan = self._plan()
        decision = self._admit(plan, self.accelerator, self.fabric_kwargs.get("precision", "32-true"))
        return _launch_and_reap(self.fabric(), self.child_timeout_s, _run_rank, plan, fn, args, kwargs, decision)


def _one_rank_auto(plan: ParallelPlan, strategy: str) -> str:
    """The strategy handed to Fabric: the plan's, or ``auto`` for a single rank (no process group)."""
    return strategy if plan.world_size > 1 else "auto"


def _check_num_nodes(plan: ParallelPlan, num_nodes: Any) -> None:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1 or plan.world_size % num_nodes:
        raise ValueError(
            f"num_nodes={num_nodes!r} must be a positive int dividing the plan's world size {plan.world_size}"
        )


def _children(fabric: Any) -> list[Any]:
    """The rank processes Fabric's script launcher started from this process (none on other ranks)."""
    return list(getattr(getattr(fabric.strategy, "launcher", None), "procs", None) or ())


def _launch_and_reap(fabric: Any, timeout_s: float, entry: Callable[..., Any], *args: Any) -> Any:
    """``fabric.launch(entry, *args)``; the launching rank then waits for the ranks it started (killed if it
    raised), and raises if one of them failed."""
    try:
        result = fabric.launch(entry, *args)
    except BaseException:
        for proc in _children(fabric):  # do not leave the started ranks running on
            proc.kill()
            proc.wait()
        raise
    _wait_for_children(fabric, timeout_s)
    return result


def _wait_for_children(fabric: Any, timeout_s: float) -> None:
    """On the launching rank, wait for the ranks Fabric started as subprocesses; raise if one failed."""
    failed = []
    for proc in _children(fabric):
        try:
            code = proc.wait(timeout=timeout_s)
        except Exception:  # subprocess.TimeoutExpired: the rank hangs
            proc.kill()
            code = "killed after timeout"
        if code != 0:
            failed.append(f"pid {proc.pid}: {code}")
    if failed:
        raise RuntimeError(
            f"{LAUNCHER}: ranks started by Fabric failed ({'; '.join(failed)}); see their output above"
        )


class TopologyBoundFabric:
    """A ``lightning.fabric.Fabric`` (what ``LightningFabricLauncher.create`` returns) whose ``launch``
    attests each rank against the plan before the function runs; every other attribute is Fabric's."""

    def __init__(self, fabric: Any, plan: ParallelPlan, *, child_timeout_s: float = 600.0,
                 admission: AdmissionDecision | None = None) -> None:
        self._fabric, self._plan, self._timeout_s = fabric, plan, child_timeout_s
        self.admission = admission  # the launch gate's decision (create() took it)
        self.topology_attestation: WorkerTopologyAttestation | None = None

    def launch(self, function: Callable[..., Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        """Fabric's ``launch``: with a function, run ``function(self, *args, **kwargs)`` on every rank once
        its rank is attested (the process group is released after it); without one, start and attest."""
        if function is None:
            result = self._fabric.launch()
            self._bind(self._fabric)
            return result
        return _launch_and_reap(self._fabric, self._timeout_s, self._run, function, args, kwargs)

    def _run(self, fabric: Any, function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        try:
            self._bind(fabric)
            return function(self, *args, **kwargs)
        finally:
            release_process_group()

    def _bind(self, fabric: Any) -> None:
        context = bind_launched_rank(self._plan, launcher=LAUNCHER, rank=int(fabric.global_rank),
                                     world_size=int(fabric.world_size),
                                     local_rank=int(getattr(fabric, "local_rank", 0)), handle=self)
        self.topology_attestation = context.attestation

    def attest_topology(self) -> WorkerTopologyAttestation:
        """This rank's attestation; raises until ``launch`` has bound it."""
        if self.topology_attestation is None:
            raise RuntimeError("Fabric topology is not attested yet; call launch() on every rank first")
        return self.topology_attestation

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fabric, name)


def _run_rank(fabric: Any, plan: ParallelPlan, fn: Callable[..., Any], args: tuple, kwargs: dict,
              admission: AdmissionDecision) -> Any:
    """Fabric's per-rank entry: bind the attestation (with the launch gate's decision), run ``fn``, destroy the
    process group."""
    try:
        context: LaunchContext = bind_launched_rank(
            plan,
            launcher=LAUNCHER,
            rank=int(fabric.global_rank),
            world_size=int(fabric.world_size),
            local_rank=int(fabric.local_rank),
            handle=fabric,
            admission=admission,
        )
        return fn(context, *args, **kwargs)
    finally:
        release_process_group()
