"""Set up an engine's worker process for numeric passes: BLAS threads, allocator, scheduling."""

from __future__ import annotations

import os

__all__ = ['cap_blas_threads', 'keep_freed_memory', 'prepare_worker', 'yield_on_wakeup']


def cap_blas_threads(limit: int = 1) -> bool:
    """Cap BLAS/OpenMP threads of this process (one per worker avoids oversubscription)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: without it the engine's own defaults stay
        return False
    threadpool_limits(limits=limit)
    return True


_M_TRIM_THRESHOLD = -1


_M_MMAP_THRESHOLD = -3


_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest allowed value on 64-bit


_TRIM_THRESHOLD_BYTES = 512 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Make glibc keep freed numpy temporaries for reuse instead of returning them to the OS.

    A freshly started worker trims its heap after every E-step, so each pass page-faults its
    temporaries in again: measured here, a 16,384-row 8-D chunk took 3.1 ms in an ``mp`` worker
    against 1.3 ms in the driver. Raising the mmap and trim thresholds (what a long-running
    process reaches by itself) removes the gap. Best effort: False where glibc is not the
    allocator (macOS, musl), and nothing changes there.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES) == 1
    return mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1 and ok


def yield_on_wakeup() -> bool:
    """Run this worker process as a batch task: when the driver wakes it, it does not preempt the driver.

    On 2 cores a woken worker took the driver's CPU while the driver was still writing the next
    worker's request (measured: ~1.1 ms per pipe write in a 2-worker ``mp`` pass), so the second
    worker started late. Linux ``SCHED_BATCH`` turns off wakeup preemption for compute-bound
    processes; elsewhere this is a no-op (False).
    """
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def prepare_worker(blas_threads: int = 1) -> bool:
    """Set up a worker process for numeric passes: BLAS capped, freed memory kept for reuse, batch scheduling."""
    keep_freed_memory()
    yield_on_wakeup()
    return cap_blas_threads(blas_threads)
