"""EM planning: row placement, the worker grid, model decomposition and sharding, memory, calibration."""
