"""``mixle.utils.parallel.resilient_em`` names: retries, blacklist, resumable checkpoints (re-exported)."""

from mixle_parallel.executors.estimation.compat.resilient_em import (
    ResilientMPEncodedData,
    _canonical_shard_payloads,  # noqa: F401 - mixle 0.8.2's private helper, imported by mixle code
    checkpointed_fold,
)

__all__ = ["ResilientMPEncodedData", "checkpointed_fold"]
