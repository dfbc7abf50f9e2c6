"""EM engines: one chunk runner per execution engine (local, mp, mpi, spark, dask, ray).

Each engine module imports its engine only when a runner is built; ``support`` holds what they
share (engine import errors naming the extra, worker assignment), ``channel`` the direct pass
socket of the dask and ray chunk holders. A new engine is one module here plus a line in
``builtin_backends.BUILTIN_ENCODED_DATA_BACKENDS`` (beside them).
"""
