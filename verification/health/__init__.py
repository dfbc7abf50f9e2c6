"""Training health: FLOPs and MFU accounting, robust rolling baselines, the per-step health monitor.

Pure (numpy, no torch): torch_native and megatron sessions feed it from their commits.
"""

from .baseline import RollingBaseline
from .flops import (
    MFUSample,
    ModelFlopConfig,
    flop_config_from_causal_lm,
    theoretical_flops_per_iter,
)
from .monitor import ANOMALY_KINDS, Anomaly, StepRecord, TrainingHealthMonitor

__all__ = [
    "ANOMALY_KINDS", "Anomaly", "MFUSample", "ModelFlopConfig", "RollingBaseline", "StepRecord",
    "TrainingHealthMonitor", "flop_config_from_causal_lm", "theoretical_flops_per_iter",
]
