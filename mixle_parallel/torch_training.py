"""mixle's ``mixle.utils.parallel.torch_training``: the torch_native backend, its session and layouts.

Torch loads on first access of a torch name, not when this module is imported.
"""

from mixle_parallel._facade import lazy_exports
from mixle_parallel.contracts import TorchSessionState

__getattr__ = lazy_exports(__name__, {
    "PendingGradientsError": "mixle_parallel.executors.torch.session_base",
    "TorchDistributedBackend": "mixle_parallel.executors.torch.backend",
    "TorchDistributedSession": "mixle_parallel.executors.torch.session",
    "describe_parameter_layouts": "mixle_parallel.executors.torch.layouts",
})

# the torch names resolve through __getattr__ above (ruff cannot see them)
__all__ = [  # noqa: F822
    "PendingGradientsError", "TorchDistributedBackend", "TorchDistributedSession", "TorchSessionState",
    "describe_parameter_layouts",
]
