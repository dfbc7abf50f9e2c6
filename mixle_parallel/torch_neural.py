"""mixle's ``mixle.utils.parallel.torch_neural``: streaming token training over torch_native (torch loads on use)."""

from mixle_parallel._facade import lazy_exports

__getattr__ = lazy_exports(__name__, {"StreamingTokenEncodedData": "mixle_parallel.executors.torch.streaming_tokens"})

__all__ = ["StreamingTokenEncodedData"]  # noqa: F822 - resolved by __getattr__ above
