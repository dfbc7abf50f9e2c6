"""RayTrainLauncher: one Ray Train worker per plan rank, each handed the attestation for its rank.

``run(fn, ...)`` computes the attestation of every plan rank on the driver, starts a
``ray.train.torch.TorchTrainer`` with ``ScalingConfig(num_workers=plan.world_size)`` (Ray Train
creates the torch process group), and in every worker checks Ray's world rank/size and the live
process group against the attestation it was handed before calling ``fn(context, ...)``. Each
worker's return value travels back through a small Ray actor; ``run`` returns them in rank
order. Ray Train owns the process group and destroys it when the workers shut down.

Any plan Ray can start is accepted: the axes are executed by the session inside (torch_native,
megatron), which checks its own capabilities. Ray is imported only inside ``run``.

``run`` and ``launch`` first pass the plan through the admission gate (``launchers.admission.admit_launch``)
for the training backend the workers run (``backend=``, ``torch_native`` by default) at ``precision``,
with ``admission=``/``certificate=``: a refused plan starts no worker and does not touch Ray. ``run``'s
contexts carry the decision (``context.admission``).
"""

from __future__ import annotations

import copy
import math
import re
import tempfile
from collections.abc import Callable
from numbers import Real
from typing import Any

from ...contracts import MissingExtraError, ParallelPlan, WorkerTopologyAttestation
from ...verification.admission import AdmissionDecision
from .admission import admit_launch
from .base import bind_launched_rank, describe_attestations

LAUNCHER = "ray_train"
# the keys RayTrainLauncher.launch adds to a worker's config (mixle 0.8.2's names)
RESERVED_CONFIG_KEYS = ("mixle_parallel_plan", "mixle_worker_topology_attestation", "_mixle_parallel_launch")


def check_resources_per_worker(resources: Any, *, use_gpu: bool) -> dict[str, float] | None:
    """Validate a Ray ``resources_per_worker`` request before Ray starts; return it with float quantities.

    Names are non-empty strings, quantities finite and >= 0, and ``use_gpu=True`` cannot ask for no GPU
    while ``use_gpu=False`` cannot ask for one (Ray would start and then wait for a worker it cannot place).
    """
    if resources is None:
        return None
    if not isinstance(resources, dict):
        raise TypeError(
            f"resources_per_worker must be a dict of resource name -> amount, got {type(resources).__name__}")
    checked: dict[str, float] = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"resources_per_worker has the key {name!r}; resource names are non-empty strings")
        if isinstance(amount, bool) or not isinstance(amount, Real) or not math.isfinite(amount) or amount < 0:
            raise ValueError(f"resources_per_worker[{name!r}]={amount!r}; amounts are finite numbers >= 0")
        checked[name] = float(amount)
    gpu = checked.get("GPU")
    if use_gpu and gpu is not None and gpu <= 0.0:
        raise ValueError(f"use_gpu=True conflicts with resources_per_worker['GPU']={gpu}; ask for GPU > 0 or drop it")
    if not use_gpu and gpu:
        raise ValueError(
            f"use_gpu=False conflicts with resources_per_worker['GPU']={gpu}; pass use_gpu=True or drop it")
    return checked


def merge_run_config(given: Any, run_config_type: Callable[..., Any], *, storage_path: str | None,
                     name: str | None) -> Any:
    """The ``RunConfig`` for ``RayTrainLauncher.launch``: ``given`` with the launcher's ``storage_path`` and
    ``name`` merged in, or a new one of ``run_config_type`` when ``given`` is None.

    A field ``given`` leaves at Ray's default (its default storage path; no name, or the name Ray
    generates from the date) takes the launcher's value; a field set in both places to different values
    is refused naming both (one of them would otherwise be dropped silently). ``given`` is never changed.
    """
    if given is None:
        return run_config_type(storage_path=storage_path, name=name)
    defaults = run_config_type()
    merged = None
    for option, ours in (("storage_path", storage_path), ("name", name)):
        theirs = getattr(given, option, None)
        if ours is None or theirs == ours:
            continue
        if not _is_ray_default(theirs, getattr(defaults, option, None)):
            raise ValueError(
                f"RayTrainLauncher({option}={ours!r}) conflicts with launch(run_config=RunConfig({option}="
                f"{theirs!r})); give {option} in one of the two places")
        merged = merged if merged is not None else copy.copy(given)
        setattr(merged, option, ours)
    return merged if merged is not None else given


def _is_ray_default(value: Any, default: Any) -> bool:
    """True when ``value`` is what Ray fills in for a field left unset: the default itself, or a name Ray
    generates from the date (the same text as a fresh default's, with other digits)."""
    if value is None or value == default:
        return True
    if not (isinstance(value, str) and isinstance(default, str)):
        return False
    return re.fullmatch(re.sub(r"\d", r"\\d", re.escape(default)), value) is not None


class _ResultBox:
    """A Ray actor body collecting each worker's return value by rank."""

    def __init__(self) -> None:
        self.results: dict[int, Any] = {}

    def put(self, rank: int, value: Any) -> None:
        self.results[rank] = value

    def get(self) -> dict[int, Any]:
        return self.results


class RayTrainLauncher:
    """Launch one worker per physical plan rank with ``ray.train.torch.TorchTrainer``."""

    def __init__(
        self,
        plan: ParallelPlan | None = None,
        *,
        use_gpu: bool = False,
        resources_per_worker: dict[str, float] | None = None,
        storage_path: str | None = None,
        name: str | None = None,
        process_group_timeout_s: int = 600,
        backend: str = "torch_native",
        precision: str = "fp32",
        admission: Any = None,
        certificate: Any = None,
    ) -> None:
        """``backend`` and ``precision``: what the workers train with, which the launch gate admits before any
        worker starts (with ``admission``/``certificate`` as a backend's ``prepare`` takes them)."""
        if plan is not None and not isinstance(plan, ParallelPlan):
            raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
        if not isinstance(use_gpu, bool):
            raise TypeError(f"use_gpu must be a bool, got {use_gpu!r}")
        self.plan, self.use_gpu = plan, use_gpu
        self.resources_per_worker = check_resources_per_worker(resources_per_worker, use_gpu=use_gpu) or None
        self.storage_path, self.name = storage_path, name
        self.process_group_timeout_s = process_group_timeout_s
        self.backend, self.precision = backend, precision
        self.admission, self.certificate = admission, certificate

    def admit(self, plan: ParallelPlan, *, use_gpu: bool | None = None) -> AdmissionDecision:
        """The launch gate for ``plan`` on CPU workers, or GPU ones with ``use_gpu`` (default: the launcher's)."""
        gpu = self.use_gpu if use_gpu is None else use_gpu
        return admit_launch(plan, launcher=LAUNCHER, backend=self.backend, precision=self.precision,
                            device_kind="cuda" if gpu else "cpu", admission=self.admission,
                            certificate=self.certificate)

    @property
    def attestations(self) -> tuple[WorkerTopologyAttestation, ...]:
        """The attestation handed to each worker, in rank order."""
        return describe_attestations(self._plan())

    def _plan(self) -> ParallelPlan:
        if self.plan is None:
            raise TypeError("this launcher was built without a plan; pass plan= to launch() or to the launcher")
        return self.plan

    def launch(
        self,
        train_loop_per_worker: Callable[[dict[str, Any]], Any],
        *,
        plan: ParallelPlan | None = None,
        train_loop_config: dict[str, Any] | None = None,
        use_gpu: bool | None = None,
        resources_per_worker: dict[str, float] | None = None,
        run_config: Any = None,
    ) -> Any:
        """mixle's form: ``TorchTrainer(...).fit()`` with ``train_loop_per_worker(config)`` on every plan rank.

        Each worker is attested before the loop runs; its ``config`` gains the plan
        (``mixle_parallel_plan``, axis sizes) and its attestation (``mixle_worker_topology_attestation``:
        rank, world_size, coordinate). ``use_gpu``/``resources_per_worker`` default to the launcher's.
        Returns Ray's ``Result``.
        """
        plan = plan if plan is not None else self._plan()
        if not isinstance(plan, ParallelPlan):
            raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
        if not callable(train_loop_per_worker):
            raise TypeError(f"train_loop_per_worker must be callable as fn(config), got {train_loop_per_worker!r}")
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise TypeError(f"train_loop_config must be a dict or None, got {type(train_loop_config).__name__}")
        reserved = sorted(set(train_loop_config or {}) & set(RESERVED_CONFIG_KEYS))
        if reserved:
            raise ValueError(f"train_loop_config uses the reserved keys {reserved}; rename them")
        gpu = self.use_gpu if use_gpu is None else use_gpu
        if not isinstance(gpu, bool):
            raise TypeError(f"use_gpu must be a bool, got {gpu!r}")
        resources = check_resources_per_worker(
            resources_per_worker if resources_per_worker is not None else self.resources_per_worker, use_gpu=gpu)
        self.admit(plan, use_gpu=gpu)
        try:
            from ray.train import RunConfig, ScalingConfig
            from ray.train.torch import TorchConfig, TorchTrainer
        except ImportError as err:
            raise MissingExtraError("ray[train]", "ray") from err
        config = {**(train_loop_config or {}), "mixle_parallel_plan": plan.as_dict(),
                  "_mixle_parallel_launch": {"plan": plan, "loop": train_loop_per_worker}}
        trainer = TorchTrainer(
            _ray_config_worker,
            train_loop_config=config,
            torch_config=TorchConfig(timeout_s=self.process_group_timeout_s),
            scaling_config=ScalingConfig(num_workers=plan.world_size, use_gpu=gpu,
                                         resources_per_worker=resources or None),
            run_config=merge_run_config(run_config, RunConfig, storage_path=self.storage_path, name=self.name),
        )
        return trainer.fit()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(context, *args, **kwargs)`` on every worker; return the results in rank order.

        ``fn``, its arguments and its results travel through Ray (cloudpickle): ``fn`` must be
        importable by the workers or defined in the driver script.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable as fn(context, ...), got {fn!r}")
        plan = self._plan()
        decision = self.admit(plan)
        try:
            import ray
            from ray.train import RunConfig, ScalingConfig
            from ray.train.torch import TorchConfig, TorchTrainer
        except ImportError as err:
            raise MissingExtraError("ray[train]", "ray") from err
        box = ray.remote(num_cpus=0)(_ResultBox).remote()
        scratch = None if self.storage_path else tempfile.TemporaryDirectory(prefix="mixle-ray-")
        try:
            trainer = TorchTrainer(
                _ray_worker,
                train_loop_config={"plan": plan, "attestations": self.attestations, "fn": fn,
                                   "args": args, "kwargs": kwargs, "box": box, "admission": decision},
                torch_config=TorchConfig(timeout_s=self.process_group_timeout_s),
                scaling_config=ScalingConfig(num_workers=plan.world_size, use_gpu=self.use_gpu,
                                             resources_per_worker=self.resources_per_worker),
                run_config=RunConfig(storage_path=self.storage_path if scratch is None else scratch.name,
                                     name=self.name),
            )
            trainer.fit()
            # ray types an actor method's .remote only under @ray.method, and .remote() as handle | class
            results = ray.get(box.get.remote())  # type: ignore[attr-defined]  # undecorated actor method
        finally:
            ray.kill(box)  # type: ignore[arg-type]  # ray: ActorClass.remote() returns ActorHandle | type
            if scratch is not None:
                scratch.cleanup()
        missing = sorted(set(range(plan.world_size)) - set(results))
        if missing:
            raise RuntimeError(f"{LAUNCHER}: ranks {missing} finished without returning a result")
        return [results[r] for r in range(plan.world_size)]


def _ray_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker loop: bind the handed attestation, run the user function, send its result."""
    import ray
    import ray.train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    attestations: tuple[WorkerTopologyAttestation, ...] = config["attestations"]
    if not 0 <= rank < len(attestations):
        raise RuntimeError(
            f"{LAUNCHER} started world rank {rank} of {world}, but the plan has {len(attestations)} ranks"
        )
    context = bind_launched_rank(
        config["plan"], launcher=LAUNCHER, rank=rank, world_size=world, local_rank=ctx.get_local_rank(),
        handle=ctx, expected=attestations[rank], admission=config["admission"],
    )
    result = config["fn"](context, *config["args"], **config["kwargs"])
    ray.get(config["box"].put.remote(rank, result))


def _ray_config_worker(config: dict[str, Any]) -> Any:
    """``launch``'s per-worker loop: attest this worker, then ``train_loop_per_worker(config)`` with the plan
    and the attestation added to ``config`` as mixle does."""
    import ray.train

    ctx = ray.train.get_context()
    launch = config["_mixle_parallel_launch"]
    context = bind_launched_rank(launch["plan"], launcher=LAUNCHER, rank=ctx.get_world_rank(),
                                 world_size=ctx.get_world_size(), local_rank=ctx.get_local_rank(), handle=ctx)
    att = context.attestation
    worker_config = {k: v for k, v in config.items() if k != "_mixle_parallel_launch"}
    worker_config["mixle_worker_topology_attestation"] = {
        "rank": att.rank, "world_size": att.world_size, "coordinate": dict(att.coordinate)}
    return launch["loop"](worker_config)
