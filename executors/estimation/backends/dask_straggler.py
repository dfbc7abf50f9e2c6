"""Giving up a silent dask worker: probe who answers, kill a straggler's process, and wait out a chunk copy.

A SIGSTOPped worker (or a hung node) is still listed by the scheduler, and its TCP connections stay
open: a survivor fetching a key from it (a dask collection's chunk it computed) waits forever, since
dask's worker-to-worker reads have no timeout. So a straggler is killed through its nanny (SIGKILL
reaches a stopped process too), which closes those connections: the survivor's fetch fails and dask
recomputes the key from the collection's graph. :func:`silent_in_copy` names the silent workers a chunk that
dask moves between workers (``sources.dask_collections.lend_to``) waits on; :func:`settle_tasks` waits for a
source's tasks (the audit's reads of a dask collection) as a pass waits for its workers: up to the timeout,
handing the silent workers they wait on to the runner at the straggler deadline.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..em_pass.chunks import WorkerTimeoutError
from .deadline import Deadline

__all__ = ["answering", "kill_worker_process", "settle_tasks", "silent_in_copy", "silent_in_tasks"]

_log = logging.getLogger("mixle_parallel.executors.estimation.backends.dask")


def _sigkill_worker(dask_worker: Any) -> int | None:
    """On a nanny (``client.run(..., nanny=True)``): SIGKILL its worker process; the pid, None without one."""
    pid = dask_worker.pid
    if pid:
        os.kill(int(pid), signal.SIGKILL)
    return int(pid) if pid else None


def kill_worker_process(client: Any, address: str) -> None:
    """SIGKILL the process of the dask worker at ``address`` through its nanny (a stopped one too), so its
    connections close and nothing waits on it; logged and left when it has no nanny."""
    try:
        client.run(_sigkill_worker, workers=[address], nanny=True)
    except Exception as exc:  # noqa: BLE001 - no nanny (a bare worker), or it is gone already
        _log.warning("dask: could not kill straggler %s through its nanny (%r); it stays stopped, dropped from "
                     "the cluster", address, exc)


async def _probe(dask_scheduler: Any, addresses: list[str], within: float) -> list[str]:
    """Inside the scheduler: the workers of ``addresses`` that answer an ``identity`` call within ``within`` s
    (served by a worker's event loop, not its task or actor threads: a busy worker answers, a stopped one not)."""
    import asyncio

    async def answers(address: str) -> bool:
        try:
            await asyncio.wait_for(dask_scheduler.rpc(address).identity(), within)
            return True
        except Exception:  # noqa: BLE001 - timed out, or the connection failed: silent
            return False

    flags = await asyncio.gather(*(answers(a) for a in addresses))
    return [a for a, ok in zip(addresses, flags) if ok]


def answering(client: Any, addresses: Sequence[str], within: float) -> set[str]:
    """The workers of ``addresses`` that answer the scheduler within ``within`` seconds."""
    if not addresses:
        return set()
    return set(client.run_on_scheduler(_probe, addresses=list(addresses), within=float(within)))


def silent_in_copy(client: Any, source: Any, address: str, within: float) -> list[str]:
    """The workers a copy of the future ``source`` onto ``address`` waits on (``address`` and the holders of
    ``source``) that do not answer within ``within`` seconds."""
    holders = list(client.who_has([source]).get(source.key, ()))
    return _silent_among(client, list(dict.fromkeys([address, *holders])), within)


def _silent_among(client: Any, involved: list[str], within: float) -> list[str]:
    """The workers of ``involved`` that do not answer the scheduler within ``within`` seconds, in order."""
    alive = answering(client, involved, within)
    return [a for a in involved if a not in alive]


def _waited_on(dask_scheduler: Any, keys: list[Any]) -> list[str]:
    """Inside the scheduler: the workers the tasks ``keys`` wait on (the one running each, the holders of its
    inputs)."""
    found: list[str] = []
    for key in keys:
        task = dask_scheduler.tasks.get(key)
        if task is None:
            continue
        if task.processing_on is not None:
            found.append(task.processing_on.address)
        for dependency in task.dependencies:
            found.extend(worker.address for worker in dependency.who_has or ())  # None when held nowhere
    return list(dict.fromkeys(found))


def silent_in_tasks(client: Any, futures: Sequence[Any], within: float) -> list[str]:
    """The workers the tasks of ``futures`` wait on (running them, holding their inputs) that do not answer
    within ``within`` seconds."""
    return _silent_among(client, list(client.run_on_scheduler(_waited_on, keys=[future.key for future in futures])),
                         within)


def settle_tasks(client: Any, futures: Mapping[str, Any], what: str, timeout: float | None,
                 patience: float | None = None, give_up: Callable[[Sequence[str]], None] | None = None) -> None:
    """Wait for ``futures`` (``what`` they compute, each future named by its part) up to ``timeout`` seconds.
    Every ``patience`` seconds without them, the workers they wait on that stay silent are handed to ``give_up``
    (the runner drops its own stragglers from the cluster; dask then runs the tasks elsewhere). Past ``timeout``
    the late tasks are cancelled and ``WorkerTimeoutError`` names them. Without ``patience`` it only waits."""
    import distributed

    deadline = Deadline(timeout)
    while True:
        late = {part: future for part, future in futures.items() if not future.done()}
        if not late:
            return
        remaining = deadline.remaining()
        wait = [t for t in (remaining, None if give_up is None else patience) if t is not None]
        try:
            distributed.wait(list(late.values()), timeout=min(wait) if wait else None)
            return
        except TimeoutError:  # distributed raises the builtin one (asyncio's, on Python 3.11)
            pass
        if deadline.expired():
            late = {part: future for part, future in late.items() if not future.done()}
            client.cancel(list(late.values()))
            raise WorkerTimeoutError(f"{what} of {', '.join(late)} did not come back within {timeout} s: the dask "
                                     "worker holding them is hung or overloaded. Raise timeout= (seconds) or check the "
                                     "workers")
        if give_up is not None and patience is not None:
            silent = silent_in_tasks(client, list(late.values()), patience)
            if silent:
                _log.warning("dask: %s of %s wait on workers silent past %.1f s: %s", what, ", ".join(late), patience,
                             silent)
                give_up(silent)
