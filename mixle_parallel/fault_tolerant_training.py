"""mixle's ``mixle.utils.parallel.fault_tolerant_training``: loader positions and background snapshots.

``StepResult``, ``SimulatedRank`` and ``ElasticTrainingJob`` are not offered yet (see docs/compat.md).
Torch loads on first access.
"""

from mixle_parallel._facade import lazy_exports

_NAMES = ("AsyncCheckpointHandle", "LoaderState", "load_checkpoint", "load_checkpoint_extra", "resume_batches",
          "save_checkpoint_async", "synthetic_batch_for_state")
__getattr__ = lazy_exports(__name__, dict.fromkeys(_NAMES, "mixle_parallel.executors.torch.fault_tolerant"))

# the names resolve through __getattr__ above (ruff cannot see them)
__all__ = [  # noqa: F822
    "AsyncCheckpointHandle", "LoaderState", "load_checkpoint", "load_checkpoint_extra", "resume_batches",
    "save_checkpoint_async", "synthetic_batch_for_state",
]
