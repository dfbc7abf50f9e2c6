"""``mixle.utils.parallel.resilient_em`` names: retries, blacklist, resumable checkpoints (re-exported)."""

from mixle_parallel.executors.estimation.resilient_em import ResilientMPEncodedData, checkpointed_fold

__all__ = ["ResilientMPEncodedData", "checkpointed_fold"]
