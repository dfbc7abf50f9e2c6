"""The ``megatron`` executor: pipeline and expert parallelism through megatron-core.

``backend`` is the registered backend, ``session`` the training loop, ``parallel_state`` the
mapping of our plan onto megatron's process groups, ``stages`` the pipeline stages,
``checkpoint`` save/load, ``cpu_compat`` what lets megatron-core run on gloo without CUDA.
Importing this package imports neither torch nor megatron; its modules do.
"""
