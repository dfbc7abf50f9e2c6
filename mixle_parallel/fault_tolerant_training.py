"""mixle's ``mixle.utils.parallel.fault_tolerant_training``: loader positions, background snapshots, and the
in-process elastic job (simulated ranks on threads). Torch loads on first access.
"""

from mixle_parallel._facade import lazy_exports

_FT = "mixle_parallel.executors.torch.fault_tolerant"
_NAMES = {
    **dict.fromkeys(("AsyncCheckpointHandle", "LoaderState", "load_checkpoint", "load_checkpoint_extra",
                     "resume_batches", "save_checkpoint_async", "synthetic_batch_for_state"), _FT),
    "StepResult": "mixle_parallel.executors.torch.simulated_rank",
    "SimulatedRank": "mixle_parallel.executors.torch.simulated_rank",
    "ElasticTrainingJob": "mixle_parallel.executors.torch.elastic_job",
}
__getattr__ = lazy_exports(__name__, _NAMES)

# the names resolve through __getattr__ above (ruff cannot see them)
__all__ = [  # noqa: F822
    "AsyncCheckpointHandle", "ElasticTrainingJob", "LoaderState", "SimulatedRank", "StepResult", "load_checkpoint",
    "load_checkpoint_extra", "resume_batches", "save_checkpoint_async", "synthetic_batch_for_state",
]
