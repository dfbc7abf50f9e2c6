"""mixle's ``mixle.utils.parallel.training_health``: FLOPs/MFU accounting, robust baselines, the health monitor.

Sessions feed a monitor themselves (``prepare(health=...)``; ``HealthOptions`` is torch's and loads
with it); these are the same pure classes for a hand-written loop.
"""

from mixle_parallel.verification.health import (
    Anomaly,
    MFUSample,
    ModelFlopConfig,
    RollingBaseline,
    StepRecord,
    TrainingHealthMonitor,
    flop_config_from_causal_lm,
    theoretical_flops_per_iter,
)

__all__ = [
    "Anomaly", "MFUSample", "ModelFlopConfig", "RollingBaseline", "StepRecord", "TrainingHealthMonitor",
    "flop_config_from_causal_lm", "theoretical_flops_per_iter",
]
