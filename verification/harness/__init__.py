"""The verification harness: run an executor on a real small mesh beside an independent reference.

``run`` holds ``verify`` (the entry point, read top to bottom); ``launch`` the two launch strategies
(a gloo mesh the harness spawns, an executor that starts its own workers); ``judge`` turns the run
into per-update verdicts; ``report`` is ``VerificationReport``; ``worker`` is what each spawned rank
executes; ``mesh`` is the one process-world spawner; ``tolerance`` the error bounds; ``collectives``,
``phases``, ``attribution`` and ``receipt_check`` the traced collectives and how they are judged;
``workloads`` the built-in seeded workloads (``tiny_lm_module``, ``moe_module``, ``em_reference``).
"""

from .mesh import MeshError, run_on_gloo_mesh
from .report import VerificationReport
from .run import verify
from .tolerance import compare, default_tolerance, tolerance_policy
from .workloads import (
    BUILTIN_WORKLOADS,
    GaussianMixtureWorkload,
    MLPWorkload,
    TinyLMWorkload,
)

__all__ = [
    "BUILTIN_WORKLOADS", "GaussianMixtureWorkload", "MLPWorkload", "MeshError", "TinyLMWorkload",
    "VerificationReport", "compare", "default_tolerance", "run_on_gloo_mesh", "tolerance_policy", "verify",
]
