"""mixle's ``mixle.utils.parallel.megatron_training``: the Megatron Bridge adapter (bridge loads when used)."""

from mixle_parallel.executors.megatron.bridge import MegatronBridgeBackend, MegatronBridgeSession

__all__ = ["MegatronBridgeBackend", "MegatronBridgeSession"]
