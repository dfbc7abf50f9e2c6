"""mixle's ``mixle.utils.parallel.dcp_checkpoint``: reshardable training checkpoints (torch loads on first use)."""

from mixle_parallel._facade import lazy_exports

_NAMES = ("AsyncTrainingCheckpoint", "async_save_training_state", "load_sharded", "load_training_metadata",
          "load_training_state", "save_frozen_training_state", "save_sharded", "save_training_state")
__getattr__ = lazy_exports(__name__, dict.fromkeys(_NAMES, "mixle_parallel.executors.torch.dcp_checkpoint"))

# the names resolve through __getattr__ above (ruff cannot see them)
__all__ = [  # noqa: F822
    "AsyncTrainingCheckpoint", "async_save_training_state", "load_sharded", "load_training_metadata",
    "load_training_state", "save_frozen_training_state", "save_sharded", "save_training_state",
]
