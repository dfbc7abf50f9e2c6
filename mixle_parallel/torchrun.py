"""``mixle.utils.parallel.torchrun`` names: SPMD EM over torch.distributed (re-exported; torch loads on use)."""

from mixle_parallel.executors.estimation.backends.torchrun import TorchRunEncodedData, torchrun_out

__all__ = ["TorchRunEncodedData", "torchrun_out"]
