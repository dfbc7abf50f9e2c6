"""Run one EM fit on an engine and list, while it runs, every listening socket of this process tree.

    python -m tests.estimation.backends.socket_probe BACKEND

Prints one JSON line: {"backend", "listening": [[pid, name, ip, port], ...], "samples"}. A sampler
thread lists the sockets every 0.1 s from before the engine starts until the fit returns.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import psutil

from tests.estimation.backends import em_case


def _listening() -> set[tuple[int, str, str, int]]:
    me = psutil.Process()
    found: set[tuple[int, str, str, int]] = set()
    for proc in [me, *me.children(recursive=True)]:
        try:
            name = proc.name()
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((proc.pid, name, conn.laddr.ip, conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def main(backend: str) -> None:
    seen: set[tuple[int, str, str, int]] = set()
    samples = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal samples
        while not done.is_set():
            seen.update(_listening())
            samples += 1
            done.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    extra: dict[str, Any] = {}
    em_case.run(backend, 2, **extra)
    seen.update(_listening())  # engines that stay up until exit (Ray) are still there
    done.set()
    thread.join()
    print(json.dumps({"backend": backend, "listening": sorted(seen), "samples": samples}))


if __name__ == "__main__":
    main(sys.argv[1])
