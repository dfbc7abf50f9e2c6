"""Giving up a silent dask worker: probe who answers, kill a straggler's process, and wait out a chunk copy.

A SIGSTOPped worker (or a hung node) is still listed by the scheduler, and its TCP connections stay
open: a survivor fetching a key from it (a dask collection's chunk it computed) waits forever, since
dask's worker-to-worker reads have no timeout. So a straggler is killed through its nanny (SIGKILL
reaches a stopped process too), which closes those connections: the survivor's fetch fails and dask
recomputes the key from the collection's graph. :func:`settle_copy` bounds the wait for a chunk that
dask moves between workers (``sources.dask_collections.lend_to``), naming the silent workers it waits on.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from typing import Any

__all__ = ["answering", "kill_worker_process", "silent_in_copy"]

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
    involved = list(dict.fromkeys([address, *holders]))
    alive = answering(client, involved, within)
    return [a for a in involved if a not in alive]
