"""TorchrunLauncher: start a script on the plan's ranks with torchrun, and bind each started rank.

The launching side builds and runs the ``torchrun`` command (``python -m torch.distributed.run``,
the module behind the ``torchrun`` console script) with one process per plan rank. Inside the
script, :meth:`TorchrunLauncher.worker` reads the torchrun environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``) and :meth:`Resources.from_torchrun`, attests the rank against the plan, creates
the process group if none exists, checks it against the attestation, and destroys it on exit.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from datetime import timedelta

from ...contracts import ParallelPlan, Resources, comm_backend_for
from .base import LaunchContext, bind_launched_rank, release_process_group

LAUNCHER = "torchrun"
_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def _env_int(environ: Mapping[str, str], key: str) -> int:
    try:
        return int(environ[key])
    except KeyError:
        raise RuntimeError(
            f"{key} is not set: this process was not started by torchrun; start the script with "
            "`torchrun --nproc-per-node N script.py` (TorchrunLauncher(plan).run(script) builds that command)"
        ) from None
    except ValueError:
        raise RuntimeError(f"{key}={environ[key]!r} is not an integer; the torchrun environment is corrupt") from None


class TorchrunLauncher:
    """Start ``plan.world_size`` ranks of a script with torchrun and bind each one to its plan coordinate."""

    def __init__(
        self,
        plan: ParallelPlan,
        *,
        nnodes: int = 1,
        rdzv_endpoint: str | None = None,
        python: str | None = None,
    ) -> None:
        if not isinstance(plan, ParallelPlan):
            raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
        if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1 or plan.world_size % nnodes:
            raise ValueError(
                f"nnodes={nnodes!r} must be a positive int dividing the plan's world size {plan.world_size}"
            )
        if nnodes > 1 and rdzv_endpoint is None:
            raise ValueError(f"nnodes={nnodes} needs rdzv_endpoint='host:port' of the rendezvous node")
        self.plan, self.nnodes, self.rdzv_endpoint = plan, nnodes, rdzv_endpoint
        self.python = python or sys.executable

    @property
    def nproc_per_node(self) -> int:
        """Processes torchrun starts on each node."""
        return self.plan.world_size // self.nnodes

    def command(self, script: str | os.PathLike[str], *args: str) -> list[str]:
        """The torchrun command line that starts ``script`` on every rank of the plan (this node's share)."""
        cmd = [self.python, "-m", "torch.distributed.run"]
        if self.nnodes == 1 and self.rdzv_endpoint is None:
            cmd.append("--standalone")  # c10d rendezvous on a free local port
        else:
            cmd += ["--nnodes", str(self.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", str(self.rdzv_endpoint)]
        cmd += ["--nproc-per-node", str(self.nproc_per_node), os.fspath(script), *map(str, args)]
        return cmd

    def run(
        self,
        script: str | os.PathLike[str],
        *args: str,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the torchrun command to completion; raise with its output if any rank failed.

        The caller's torchrun variables (``RANK``, ``MASTER_PORT``, ...) are removed from the child
        environment so a launcher started inside another distributed job does not join that job.
        """
        child_env = {k: v for k, v in (os.environ if env is None else env).items()
                     if k not in (*_RANK_ENV, "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")}
        cmd = self.command(script, *args)
        try:
            done = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
        except subprocess.TimeoutExpired as err:
            raise TimeoutError(f"torchrun did not finish within {timeout_s} s: {' '.join(cmd)}") from err
        if done.returncode != 0:
            raise RuntimeError(
                f"torchrun exited with status {done.returncode}: {' '.join(cmd)}\n--- output ---\n"
                f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
            )
        return done

    @classmethod
    @contextlib.contextmanager
    def worker(
        cls,
        plan: ParallelPlan,
        *,
        backend: str | None = None,
        timeout: timedelta = timedelta(minutes=10),
    ) -> Iterator[LaunchContext]:
        """Inside a torchrun-started script: attest this rank, own the process group, yield the context.

        The attestation is bound from the torchrun environment *before* the process group is
        created (a world-size mismatch fails without touching the network), then re-checked
        against the live group. A group this call creates is destroyed when the block exits.
        """
        rank, world, local_rank = (_env_int(os.environ, k) for k in _RANK_ENV)
        context = bind_launched_rank(plan, launcher=LAUNCHER, rank=rank, world_size=world, local_rank=local_rank)
        resources = Resources.from_torchrun()
        if len(resources.devices) != world or resources.devices[rank].name != f"rank:{rank}":
            raise RuntimeError(
                f"Resources.from_torchrun lists {[d.name for d in resources.devices]} for rank {rank} of {world}; "
                "the torchrun environment is inconsistent"
            )
        created = _init_process_group(backend, timeout) if world > 1 else False
        try:
            yield bind_launched_rank(plan, launcher=LAUNCHER, rank=rank, world_size=world, local_rank=local_rank,
                                     handle=resources, expected=context.attestation)
        finally:
            if created:
                release_process_group()


def _init_process_group(backend: str | None, timeout: timedelta) -> bool:
    """Create the default group from the torchrun environment unless one exists; True when created here."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if backend is None:
        backend = default_process_group_backend(device)
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=timeout)
    return True


def default_process_group_backend(device: str) -> str:
    """The default group's backend for a rank on ``device``: ``gloo`` on the CPU; on CUDA, nccl for device
    tensors and gloo for CPU tensors (``cpu:gloo,cuda:nccl``), so CPU-side counts still reduce."""
    comm = comm_backend_for(device)
    return f"cpu:gloo,cuda:{comm}" if comm != "gloo" else comm
