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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mixle_parallel.contracts import BackendCapabilities, CapabilityError, MissingExtraError, ParallelAxis, ParallelPlan
from mixle_parallel.executors.launchers.base import LaunchContext, bind_launched_rank, release_process_group

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


def fabric_strategy(plan: ParallelPlan) -> str:
    """The Fabric strategy name for a data-parallel plan: ``ddp`` (replicated) or ``fsdp`` (sharded)."""
    problems = CAPABILITIES.problems(plan)
    if problems:
        raise CapabilityError(
            "LightningFabricLauncher runs pure data parallelism (DDP or FSDP) only: " + "; ".join(problems)
            + ". Run model axes with a torch_native or megatron session under TorchrunLauncher or RayTrainLauncher"
        )
    return "fsdp" if plan.dp_shard > 1 else "ddp"


class LightningFabricLauncher:
    """Create Fabric for pure DDP or FSDP jobs and launch ``fn(context)`` on every plan rank."""

    def __init__(
        self,
        plan: ParallelPlan,
        *,
        accelerator: str = "cpu",
        num_nodes: int = 1,
        child_timeout_s: float = 600.0,
        **fabric_kwargs: Any,
    ) -> None:
        if not isinstance(plan, ParallelPlan):
            raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
        # the gate runs here, before anything imports lightning
        self.strategy = fabric_strategy(plan)
        if (
            isinstance(num_nodes, bool)
            or not isinstance(num_nodes, int)
            or num_nodes < 1
            or plan.world_size % num_nodes
        ):
            raise ValueError(
                f"num_nodes={num_nodes!r} must be a positive int dividing the plan's world size {plan.world_size}"
            )
        if self.strategy == "fsdp" and accelerator == "cpu":
            raise ValueError(
                f"plan {plan.describe()} shards parameters, and Fabric runs FSDP only on GPUs; pass "
                "accelerator='gpu', or run a torch_native session (FSDP2 on CPU) under TorchrunLauncher or "
                "RayTrainLauncher"
            )
        for key in ("strategy", "devices"):
            if key in fabric_kwargs:
                raise ValueError(f"{key} is derived from the plan; do not pass {key}={fabric_kwargs[key]!r}")
        self.plan, self.accelerator, self.num_nodes = plan, accelerator, num_nodes
        self.child_timeout_s = child_timeout_s
        self.fabric_kwargs = fabric_kwargs

    @property
    def devices(self) -> int:
        """Processes Fabric starts on each node."""
        return self.plan.world_size // self.num_nodes

    def fabric(self) -> Any:
        """A ``lightning.fabric.Fabric`` for the plan (imports lightning)."""
        try:
            from lightning.fabric import Fabric
        except ImportError as err:
            raise MissingExtraError("lightning", "lightning") from err
        strategy = self.strategy if self.plan.world_size > 1 else "auto"
        return Fabric(
            accelerator=self.accelerator,
            devices=self.devices,
            num_nodes=self.num_nodes,
            strategy=strategy,
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
        fabric = self.fabric()
        try:
            result = fabric.launch(_run_rank, self.plan, fn, args, kwargs)
        except BaseException:
            for proc in self._children(fabric):  # do not leave the started ranks running on
                proc.kill()
                proc.wait()
            raise
        self._wait_for_children(fabric)
        return result

    @staticmethod
    def _children(fabric: Any) -> list[Any]:
        """The rank processes Fabric's script launcher started from this process (none on other ranks)."""
        return list(getattr(getattr(fabric.strategy, "launcher", None), "procs", None) or ())

    def _wait_for_children(self, fabric: Any) -> None:
        """On the launching rank, wait for the ranks Fabric started as subprocesses; raise if one failed."""
        failed = []
        for proc in self._children(fabric):
            try:
                code = proc.wait(timeout=self.child_timeout_s)
            except Exception:  # subprocess.TimeoutExpired: the rank hangs
                proc.kill()
                code = "killed after timeout"
            if code != 0:
                failed.append(f"pid {proc.pid}: {code}")
        if failed:
            raise RuntimeError(
                f"{LAUNCHER}: ranks started by Fabric failed ({'; '.join(failed)}); see their output above"
            )


def _run_rank(fabric: Any, plan: ParallelPlan, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Fabric's per-rank entry: bind the attestation, run ``fn``, destroy the process group."""
    try:
        context: LaunchContext = bind_launched_rank(
            plan,
            launcher=LAUNCHER,
            rank=int(fabric.global_rank),
            world_size=int(fabric.world_size),
            local_rank=int(fabric.local_rank),
            handle=fabric,
        )
        return fn(context, *args, **kwargs)
    finally:
        release_process_group()
