"""The verification harness: run an executor on a real small mesh beside an independent reference.

``run`` measures and judges, ``worker`` is what each spawned rank executes, ``mesh`` is the one
process-world spawner, ``tolerance`` the error bounds, ``collectives`` the traced collectives,
``workloads`` the built-in seeded workloads.
"""

from .mesh import MeshError, run_on_gloo_mesh
from .run import VerificationReport, verify
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
