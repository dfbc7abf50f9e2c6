"""Real gloo process worlds for the checkpoint tests: a launcher and the per-rank scenarios.

``launch_world`` starts the ranks with the project's one spawner (``verification.harness.mesh``),
torchrun's variables set. Each scenario runs several cases in one process world (process start
dominates the cost on a loaded 2-core machine) and returns a JSON document per rank to judge.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

from mixle_parallel.verification.harness.mesh import MeshError, run_world

GLOBAL_BATCH = 8
START_STEP, RESUME_STEPS = 3, 4
# fp32 tolerance for a resharded resume: the same global batch and global-mean gradient, summed in
# a different order (per-rank partial sums and reduce-scatter over 2 or 1 ranks instead of 4).
RTOL, ATOL = 1e-5, 1e-6


def resume_close(a: list[float], b: list[float]) -> bool:
    """Equal length and every value within the resharded-resume tolerance (``RTOL``, ``ATOL``) of ``b``."""
    return len(a) == len(b) and all(abs(x - y) <= ATOL + RTOL * abs(y) for x, y in zip(a, b))


def launch_world(scenario: str, world: int, root: Path, out: Path, *, timeout: float = 420.0) -> list[dict[str, Any]]:
    """Run ``world`` ranks of ``scenario`` on the project's one spawner; their result documents in rank order.

    Each rank's result also lands in ``OUT/<scenario>-rank<R>.json`` (kept for a look after a failure).
    """
    out.mkdir(parents=True, exist_ok=True)
    try:
        results = run_world(_scenario_rank, world, scenario, str(root), timeout=timeout, torchrun_env=True,
                            group_timeout_s=300.0, backend="gloo")
    except MeshError as err:
        raise AssertionError(f"{scenario} world {world}: {err}") from None
    for rank, text in enumerate(results):
        (out / f"{scenario}-rank{rank}.json").write_text(text)
    return [json.loads(text) for text in results]


# ---- everything below runs inside a rank ----------------------------------------------------
def _build(world: int, seed: int, rank: int):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                torch.nn.Tanh(), torch.nn.Linear(16, 4))
    if world > 1:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    torch.manual_seed(1234 + rank)  # per-rank run seed, whichever init seed the model had
    return model, optimizer, scheduler


def _batch(step: int, rank: int, world: int):
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(GLOBAL_BATCH, 8, generator=gen), torch.randn(GLOBAL_BATCH, 4, generator=gen)
    per = GLOBAL_BATCH // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def _train_step(model, optimizer, scheduler, step: int, rank: int, world: int) -> float:
    """One SGD step on this rank's slice; returns the global mean loss."""
    import torch.distributed as dist

    x, y = _batch(step, rank, world)
    optimizer.zero_grad(set_to_none=True)
    squared = (model(x) - y).pow(2).sum(dim=1)
    squared.mean().backward()  # FSDP2 averages over ranks: equal slices give the global mean
    optimizer.step()
    scheduler.step()
    total = squared.detach().sum().reshape(1)
    dist.all_reduce(total)
    return float(total.item()) / GLOBAL_BATCH


def _full_params(model) -> dict[str, list[float]]:
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().reshape(-1).tolist()
            for k, v in model.state_dict().items()}


def _session_state(step: int) -> dict[str, Any]:
    return {"step": step, "pending_accumulation": 0, "optimizer_receipt": {"name": "SGD"}}


def _save(root, model, optimizer, scheduler, step, **kwargs):
    from mixle_parallel.executors.torch.checkpoint import save_checkpoint

    return save_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler,
                           session_state=_session_state(step),
                           loader_state={"epoch": 0, "samples_consumed": step * GLOBAL_BATCH},
                           typed_scheduler_state={"kind": "step", "gamma": 0.5, "milestones": (2, 4)},
                           extra={"note": "checkpoint test", "best_loss": float("inf")}, **kwargs)


def _expect_error(fn) -> dict[str, Any]:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the test judges type and message
        return {"type": type(err).__name__, "message": str(err), "path": getattr(err, "path", None)}
    return {"type": None, "message": "no error raised", "path": None}


def _scenario_world4(root: Path, rank: int, world: int) -> dict[str, Any]:
    """Train, save, go on uninterrupted; reload at world 4; refuse a corrupted copy; async save."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from mixle_parallel.executors.torch.checkpoint import load_checkpoint

    result: dict[str, Any] = {}
    model, optimizer, scheduler = _build(world, seed=0, rank=rank)
    result["losses_before"] = [_train_step(model, optimizer, scheduler, s, rank, world) for s in range(START_STEP)]
    handle = _save(root / "main", model, optimizer, scheduler, START_STEP)
    result["sync_done"] = handle.done()
    result["rand_after_save"] = torch.rand(3).tolist()
    result["reference_losses"] = [_train_step(model, optimizer, scheduler, s, rank, world)
                                  for s in range(START_STEP, START_STEP + RESUME_STEPS)]
    result["reference_params"] = _full_params(model)
    result["reference_lr"] = optimizer.param_groups[0]["lr"]

    # same world: everything, RNG included, is restored exactly
    model_b, optimizer_b, scheduler_b = _build(world, seed=99, rank=rank)
    loaded = load_checkpoint(root / "main", model=model_b, optimizer=optimizer_b, scheduler=scheduler_b)
    result["same_world_loaded"] = {k: v for k, v in loaded.items() if k != "typed_scheduler_state"}
    result["same_world_typed_scheduler_state"] = repr(loaded["typed_scheduler_state"])
    result["same_world_rand"] = torch.rand(3).tolist()
    result["same_world_losses"] = [_train_step(model_b, optimizer_b, scheduler_b, s, rank, world)
                                   for s in range(START_STEP, START_STEP + RESUME_STEPS)]
    result["same_world_lr"] = optimizer_b.param_groups[0]["lr"]

    # a corrupted copy is refused on every rank, naming the file
    if rank == 0:
        shutil.copytree(root / "main", root / "corrupt")
        victim = sorted((root / "corrupt" / "gen-00000001" / "dcp").glob("__2_*.distcp"))[0]
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x40
        victim.write_bytes(bytes(data))
        result["corrupted_file"] = str(victim)
    dist.barrier()
    before = _full_params(model_b)
    result["corrupt_error"] = _expect_error(lambda: load_checkpoint(
        root / "corrupt", model=model_b, optimizer=optimizer_b, scheduler=scheduler_b))
    result["corrupt_left_params_unchanged"] = before == _full_params(model_b)

    # asynchronous save: training steps run while the (gated) write is pending
    gate, original = threading.Event(), dcp.FileSystemWriter.write_data

    def gated_write(self, plan, planner):
        gate.wait(timeout=300)
        return original(self, plan, planner)

    dcp.FileSystemWriter.write_data = gated_write
    try:
        at_save = _full_params(model)
        step = START_STEP + RESUME_STEPS
        handle = _save(root / "async", model, optimizer, scheduler, step, asynchronous=True)
        result["async_steps_while_pending"] = [_train_step(model, optimizer, scheduler, s, rank, world)
                                               for s in range(step, step + 2)]
        result["async_done_before_release"] = handle.done()
        result["async_pointer_before_release"] = (root / "async" / "LATEST").exists()
        result["params_moved_meanwhile"] = at_save != _full_params(model)
        gate.set()
        handle.wait()
        result["async_done_after_wait"] = handle.done()
    finally:
        dcp.FileSystemWriter.write_data = original
    model_c, optimizer_c, scheduler_c = _build(world, seed=7, rank=rank)
    loaded = load_checkpoint(root / "async", model=model_c, optimizer=optimizer_c, scheduler=scheduler_c)
    result["async_loaded_step"] = loaded["session_state"]["step"]
    result["async_params_equal_at_save"] = _full_params(model_c) == at_save
    # a load while an asynchronous save is in flight first waits for it to be published
    _save(root / "async", model, optimizer, scheduler, step + 2, asynchronous=True)
    loaded = load_checkpoint(root / "async", model=model_c, optimizer=optimizer_c, scheduler=scheduler_c)
    result["drained_generation"] = loaded["generation"]
    result["drained_params_equal"] = _full_params(model_c) == _full_params(model)
    return result


def _scenario_resharded(root: Path, rank: int, world: int) -> dict[str, Any]:
    """Load the world-4 checkpoint at this world size: refused without permission, then resumed."""
    import torch
    import torch.distributed as dist

    from mixle_parallel.executors.torch.checkpoint import load_checkpoint
    from mixle_parallel.executors.torch.checkpoint_manifest import derive_seed

    result: dict[str, Any] = {}
    model, optimizer, scheduler = _build(world, seed=99, rank=rank)
    before = _full_params(model)
    result["refused"] = _expect_error(lambda: load_checkpoint(
        root / "main", model=model, optimizer=optimizer, scheduler=scheduler))
    result["refused_left_params_unchanged"] = before == _full_params(model)
    loaded = load_checkpoint(root / "main", model=model, optimizer=optimizer, scheduler=scheduler,
                             allow_world_size_change=True)
    result["loaded"] = {k: v for k, v in loaded.items() if k != "typed_scheduler_state"}
    result["rand"] = torch.rand(3).tolist()
    seed = derive_seed("mixle-parallel/rng", 1234, START_STEP, rank, world)
    result["rand_by_rule"] = torch.rand(3, generator=torch.Generator().manual_seed(seed)).tolist()
    result["losses"] = [_train_step(model, optimizer, scheduler, s, rank, world)
                        for s in range(START_STEP, START_STEP + RESUME_STEPS)]
    result["params"] = _full_params(model)
    result["lr"] = optimizer.param_groups[0]["lr"]
    if rank == 0:  # a torn pointer is refused on every rank, naming the pointer
        shutil.copytree(root / "main", root / f"torn{world}")
        pointer = root / f"torn{world}" / "LATEST"
        pointer.write_bytes(pointer.read_bytes()[:25])
    dist.barrier()
    result["torn_error"] = _expect_error(lambda: load_checkpoint(
        root / f"torn{world}", model=model, optimizer=optimizer, scheduler=scheduler,
        allow_world_size_change=True))
    return result


# ---- the same through the torch_native session (TinyLM, default token cross-entropy) ---------
def _session(world: int, seed: int):
    import torch

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend
    from tests.torch._models import TinyLM

    torch.manual_seed(seed)
    backend = get_training_backend("torch_native")
    return backend.prepare(
        TinyLM(), plan=ParallelPlan(dp_shard=world), admission="unverified",
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9),
        scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))


def _tokens(step: int, rank: int, world: int):
    import torch

    from tests.torch._models import SEQ, VOCAB

    gen = torch.Generator().manual_seed(2000 + step)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=gen)
    per = GLOBAL_BATCH // world
    mine = tokens[rank * per:(rank + 1) * per]
    return mine[:, :-1], mine[:, 1:]


def _session_steps(session, steps, rank: int, world: int) -> list[float]:
    losses = []
    for step in steps:
        receipt = session.train_batch(*_tokens(step, rank, world))
        assert not receipt.skipped, receipt
        losses.append(receipt.loss)
    return losses


def _session_params(session) -> dict[str, list[float]]:
    return _full_params(session.module)


def _scenario_session4(root: Path, rank: int, world: int) -> dict[str, Any]:
    """Session at dp_shard=4: train, save (sync and async), continue uninterrupted."""
    result: dict[str, Any] = {}
    session = _session(world, seed=0)
    result["losses_before"] = _session_steps(session, range(START_STEP), rank, world)
    handle = session.save_checkpoint(str(root / "session"), loader_state={"epoch": 0, "samples": 24},
                                     extra={"run": "e2e"})
    result["generation"] = handle.wait().name
    result["reference_losses"] = _session_steps(session, range(START_STEP, START_STEP + RESUME_STEPS), rank, world)
    result["reference_params"] = _session_params(session)
    at_save = _session_params(session)
    handle = session.save_checkpoint(str(root / "session_async"), asynchronous=True)
    result["async_steps"] = _session_steps(session, range(10, 12), rank, world)  # train while it writes
    handle.wait()
    fresh = _session(world, seed=5)
    loaded = fresh.load_checkpoint(str(root / "session_async"))
    result["async_step"] = fresh.step
    result["async_equal"] = _session_params(fresh) == at_save and loaded["saved_world_size"] == world
    fresh.close()
    session.close()
    return result


def _scenario_session_resharded(root: Path, rank: int, world: int) -> dict[str, Any]:
    """Session at dp_shard=world: refuse without permission, then load resharded and continue."""
    result: dict[str, Any] = {}
    session = _session(world, seed=7)
    result["refused"] = _expect_error(lambda: session.load_checkpoint(str(root / "session")))
    loaded = session.load_checkpoint(str(root / "session"), allow_world_size_change=True)
    result["loaded"] = {k: loaded[k] for k in ("loader_state", "extra", "saved_world_size", "world_size", "rng")}
    result["state"] = {"step": session.state().step, "pending": session.state().pending_accumulation}
    result["losses"] = _session_steps(session, range(START_STEP, START_STEP + RESUME_STEPS), rank, world)
    result["params"] = _session_params(session)
    session.close()
    return result


SCENARIOS = {"world4": _scenario_world4, "resharded": _scenario_resharded,
             "session4": _scenario_session4, "session_resharded": _scenario_session_resharded}


def _scenario_rank(rank: int, world: int, scenario: str, root: str) -> str:
    """One rank of ``scenario`` (the process group is up); its result as a JSON document."""
    import torch.distributed as dist

    result = SCENARIOS[scenario](Path(root), rank, world)
    dist.barrier()
    return json.dumps(result, default=str)
