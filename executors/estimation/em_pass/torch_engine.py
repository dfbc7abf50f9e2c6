"""The torch compute engine of the EM E-step (``encoded_data(..., engine="torch")``).

:func:`bind` wraps an estimator and a model so that, wherever a chunk is resident (the driver's
threads for ``local``, a worker process for ``mp``), the accumulator's ``update`` runs the torch
kernels of ``torch_kernels`` on the chunk's tensors and the model's ``log_density`` does too.
Everything else -- encoding, initialization draws, the fixed combine order, the M-step, digests,
the SDC audit -- is the numpy path's, because the kernels return statistics in the numpy
accumulators' own form. Chunk tensors are made once per chunk and device (zero-copy for float64
on the CPU; cached otherwise, up to :data:`CACHE_BYTES`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from ..em_pass.engine_choice import (
    EngineChoice,
    kernel_kind,
    supported_names,
    torch_kernel_problem,
)
from ..models import MixtureDistribution
from .torch_kernels import ChunkTensors, estep, log_density

__all__ = [
    "CACHE_BYTES", "TorchEngineAccumulator", "TorchEngineAccumulatorFactory", "TorchEngineEstimator",
    "TorchEngineModel", "bind", "check_engine", "chunk_tensors", "clear_device_cache", "resolve_device",
]

CACHE_BYTES = int(os.environ.get("MIXLE_PARALLEL_TORCH_CACHE_BYTES", str(4 << 30)))
"""Most bytes of chunk tensors kept per process (copies only: float64 CPU tensors share the numpy memory)."""

_DTYPES = {"fp64": torch.float64, "fp32": torch.float32}
_NUMPY_OF = {torch.float64: np.dtype(np.float64), torch.float32: np.dtype(np.float32), torch.int64: np.dtype(np.int64)}


def resolve_device(choice: EngineChoice) -> str:
    """The device the choice runs on (``cuda`` when present and none was named), or ValueError."""
    device = choice.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"engine 'torch:{device}' needs a CUDA device and torch sees none; use 'torch:cpu'")
        index = int(device.partition(":")[2] or torch.cuda.current_device())
        if index >= torch.cuda.device_count():
            raise ValueError(f"engine 'torch:{device}': there are {torch.cuda.device_count()} CUDA device(s)")
        return f"cuda:{index}"
    return "cpu"


def check_engine(choice: EngineChoice, *objects: Any) -> EngineChoice:
    """The choice with its device resolved, once every estimator/model in ``objects`` has torch kernels."""
    for obj in objects:
        problem = torch_kernel_problem(obj)
        if problem is not None:
            raise ValueError(f"engine='torch' has no E-step kernel for {problem}; it has kernels for "
                             f"{supported_names()}. Use engine='numpy' (the default) for this model")
    return EngineChoice(choice.name, resolve_device(choice), choice.precision)


# ---- chunk tensors ---------------------------------------------------------------------------------------
class _TensorCache:
    """Tensors of chunk arrays per (array, device, dtype), least recently used dropped past a byte budget.

    An entry keeps its numpy array alive, so the array's id cannot be reused while it is cached."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._entries: OrderedDict[tuple[int, str, torch.dtype], tuple[np.ndarray, torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, array: np.ndarray, device: str, dtype: torch.dtype) -> torch.Tensor:
        """The tensor of ``array`` on ``device`` (floats as ``dtype``, integers as int64)."""
        target = dtype if array.dtype.kind == "f" else torch.int64
        if device == "cpu" and array.dtype == _NUMPY_OF[target]:
            return _shared(array)  # zero-copy: the numpy memory itself
        key = (id(array), device, target)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit[1]
        tensor = _shared(array).to(device=device, dtype=target)
        with self._lock:
            self._entries[key] = (array, tensor)
            self.used += tensor.element_size() * tensor.nelement()
            while self.used > self.budget and len(self._entries) > 1:
                _, (_, old) = self._entries.popitem(last=False)
                self.used -= old.element_size() * old.nelement()
        return tensor

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.used = 0


def _shared(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over the array's memory (read-only shared memory included: the kernels never write)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
        return torch.from_numpy(np.ascontiguousarray(array))


_CACHE = _TensorCache(CACHE_BYTES)


class _OneThread:
    """Torch's intra-op threads at 1 while any CPU kernel runs (restored after the last one leaves).

    A CPU reduction's bits depend on how many threads split it; one thread per kernel makes a
    chunk's statistics the same bits in every process (parallelism comes from the backend's workers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._saved = 1

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._saved = torch.get_num_threads()
                if self._saved != 1:
                    torch.set_num_threads(1)
            self._depth += 1

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._saved != 1:
                torch.set_num_threads(self._saved)


_ONE_THREAD = _OneThread()


def _kernel_context(chunk: ChunkTensors) -> Any:
    """``no_grad`` plus, on the CPU, one intra-op thread (see :class:`_OneThread`)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.no_grad())
    if chunk.device.type == "cpu":
        stack.enter_context(_ONE_THREAD)
    return stack


def clear_device_cache() -> None:
    """Drop this process's cached chunk tensors (the handle does so on ``close``)."""
    _CACHE.clear()


def chunk_tensors(kind: str, enc: Any, choice: EngineChoice) -> ChunkTensors:
    """A chunk's encoded data (the numpy encoders' form for ``kind``) as tensors on the choice's device."""
    device, dtype = choice.device or "cpu", _DTYPES[choice.precision]
    if kind == "categorical":
        uniques, inv = enc
        return ChunkTensors((uniques, _CACHE.get(inv, device, dtype)), len(inv), dtype, torch.device(device))
    if kind == "poisson":
        x, lgx = enc
        return ChunkTensors((_CACHE.get(x, device, dtype), _CACHE.get(lgx, device, dtype)), len(x), dtype,
                            torch.device(device))
    return ChunkTensors(_CACHE.get(enc, device, dtype), len(enc), dtype, torch.device(device))


def _data_kind(model: Any) -> str:
    """The kind whose encoding the chunk data has: the (first) component's kind."""
    first = model.components[0] if type(model) is MixtureDistribution else model
    kind = kernel_kind(first)
    if kind is None:
        raise TypeError(f"engine='torch' has no E-step kernel for {type(first).__name__}; use engine='numpy'")
    return kind


# ---- engine-bound estimator, accumulator and model ---------------------------------------------------------
class TorchEngineModel:
    """A built-in model whose ``log_density`` runs on the torch engine; everything else is the model's."""

    def __init__(self, inner: Any, engine_choice: EngineChoice) -> None:
        self.inner, self.engine_choice = inner, engine_choice

    def log_density(self, enc: Any) -> np.ndarray:
        """Per-row log density (float64 numpy), computed by the torch kernels."""
        chunk = chunk_tensors(_data_kind(self.inner), enc, self.engine_choice)
        with _kernel_context(chunk):
            return log_density(self.inner, chunk)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "engine_choice"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class TorchEngineAccumulator:
    """The numpy accumulator of an estimator, its ``update`` (the E-step) run by the torch kernels."""

    def __init__(self, inner: Any, engine_choice: EngineChoice) -> None:
        self.inner, self.engine_choice = inner, engine_choice

    def update(self, enc: Any, weights: np.ndarray | None, model: Any) -> np.ndarray:
        """Add the chunk's statistics under ``model``; returns the per-row log density."""
        model = model.inner if isinstance(model, TorchEngineModel) else model
        chunk = chunk_tensors(_data_kind(model), enc, self.engine_choice)
        w = None if weights is None else torch.as_tensor(np.asarray(weights, np.float64), device=chunk.device)
        with _kernel_context(chunk):
            ll, stats = estep(model, chunk, w)
        self.inner.combine(stats)
        return ll

    def initialize(self, enc: Any, weights: np.ndarray, rng: np.random.Generator) -> None:
        """The numpy accumulator's random start (draws must not depend on the engine)."""
        self.inner.initialize(enc, weights, rng)

    def combine(self, stats: Any) -> TorchEngineAccumulator:
        """Add another accumulator's value."""
        self.inner.combine(stats)
        return self

    def value(self) -> Any:
        """The numpy accumulator's plain-data statistics."""
        return self.inner.value()

    def from_value(self, stats: Any) -> TorchEngineAccumulator:
        """Load statistics."""
        self.inner.from_value(stats)
        return self


class TorchEngineAccumulatorFactory:
    """Makes engine-bound accumulators (picklable: the estimator and the choice)."""

    def __init__(self, inner: Any, engine_choice: EngineChoice) -> None:
        self.inner, self.engine_choice = inner, engine_choice

    def make(self) -> TorchEngineAccumulator:
        """A fresh engine-bound accumulator."""
        return TorchEngineAccumulator(self.inner.accumulator_factory().make(), self.engine_choice)


class TorchEngineEstimator:
    """A built-in estimator whose E-step runs on the torch engine; the M-step is the estimator's own."""

    def __init__(self, inner: Any, engine_choice: EngineChoice) -> None:
        self.inner, self.engine_choice = inner, engine_choice

    def accumulator_factory(self) -> TorchEngineAccumulatorFactory:
        """Factory of engine-bound accumulators."""
        return TorchEngineAccumulatorFactory(self.inner, self.engine_choice)

    def estimate(self, nobs: float | None, stats: Any) -> Any:
        """The estimator's own M-step (a plain numpy model)."""
        return self.inner.estimate(nobs, stats)

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "engine_choice"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def bind(estimator: Any, model: Any, choice: EngineChoice) -> tuple[Any, Any]:
    """``(estimator, model)`` bound to the torch engine (either may be None); ValueError without kernels."""
    raw_est = estimator.inner if isinstance(estimator, TorchEngineEstimator) else estimator
    raw_model = model.inner if isinstance(model, TorchEngineModel) else model
    choice = check_engine(choice, raw_est, raw_model)
    return (None if raw_est is None else TorchEngineEstimator(raw_est, choice),
            None if raw_model is None else TorchEngineModel(raw_model, choice))
