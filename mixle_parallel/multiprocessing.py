"""mixle's ``mixle.utils.parallel.multiprocessing``: the handle over local worker processes.

A thin re-export of ``executors.estimation.reference_handles.MPEncodedData`` (the ``mp`` backend).
"""

from mixle_parallel.executors.estimation.compat.reference_handles import MPEncodedData

__all__ = ["MPEncodedData"]
