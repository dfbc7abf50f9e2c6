"""``engine=`` and ``precision=`` of ``encoded_data``: which compute engine runs the E-step, checked up front.

Two words are kept apart, as in mixle 0.8.2's ``encoded_data``: the *engine* (``engine=``, here) is what computes
the E-step (numpy or torch); the *backend* (``backend=``) is the transport that runs the chunks (local, mp, mpi,
spark, dask, ray, torchrun, ...; the modules of ``backends/``). The torch engine is ``torch_engine`` and
``torch_kernels`` beside this module.

The numpy engine (the default) computes in float64 only. The torch engine (``engine="torch"``,
``"torch:cpu"``, ``"torch:cuda"``, ``"torch:cuda:1"``, or a mixle ``TorchEngine`` object) runs
the E-step kernels of the models in :data:`TORCH_KERNEL_MODELS` on torch tensors in fp64 or fp32.
Everything here is plain Python (no torch import): names, precisions and model kinds are checked
before any worker starts; the device is checked by the torch engine module itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..compat.mixle_interop import MixleEstimator, MixleModel
from ..models import (
    CategoricalDistribution,
    CategoricalEstimator,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    PoissonDistribution,
    PoissonEstimator,
)

__all__ = [
    "EM_ENGINES", "ENGINE_PRECISIONS", "TORCH_KERNEL_MODELS", "EngineChoice", "engine_hint", "kernel_kind",
    "resolve_engine",
    "supported_names", "torch_kernel_problem",
]

EM_ENGINES = ("numpy", "torch")
"""Compute engines of the EM E-step (``engine=``)."""

ENGINE_PRECISIONS = {"numpy": ("fp64",), "torch": ("fp64", "fp32")}
"""The precisions each engine computes in (``precision=``); the first is the default."""

_PRECISION_NAMES = {"fp64": "fp64", "float64": "fp64", "double": "fp64", "f64": "fp64",
                    "fp32": "fp32", "float32": "fp32", "single": "fp32", "f32": "fp32"}

TORCH_KERNEL_MODELS = {
    "gaussian": (GaussianEstimator, GaussianDistribution),
    "diagonal": (DiagonalGaussianEstimator, DiagonalGaussianDistribution),
    "full": (MultivariateGaussianEstimator, MultivariateGaussianDistribution),
    "categorical": (CategoricalEstimator, CategoricalDistribution),
    "poisson": (PoissonEstimator, PoissonDistribution),
}
"""Kernel kind -> (estimator class, distribution class) the torch engine has E-step kernels for;
a ``MixtureEstimator``/``MixtureDistribution`` of any of them (kinds may differ) is supported too."""

_KIND_OF = {cls: kind for kind, classes in TORCH_KERNEL_MODELS.items() for cls in classes}

_ENCODING_OF = {"gaussian": "scalar rows", "diagonal": "vector rows", "full": "vector rows",
                "categorical": "categorical values", "poisson": "counts"}
"""The rows each kind encodes: a mixture's components must all read the same encoding."""


@dataclass(frozen=True)
class EngineChoice:
    """A resolved compute engine: its name, device (None: the engine's default) and precision."""

    name: str
    device: str | None
    precision: str

    def __str__(self) -> str:
        where = f":{self.device}" if self.device else ""
        return f"{self.name}{where} ({self.precision})"


def _precision_name(precision: Any) -> str | None:
    """``'fp64'``/``'fp32'`` for a known spelling (str, numpy or torch dtype), else None."""
    text = getattr(precision, "__name__", None) or str(precision)
    text = text.replace("torch.", "").replace("numpy.", "").lower()
    return _PRECISION_NAMES.get(text)


def _engine_parts(engine: Any) -> tuple[str, str | None, Any]:
    """(name, device, precision of an engine object) of an ``engine=`` value, or ValueError."""
    if isinstance(engine, str):
        name, _, device = engine.strip().lower().partition(":")
        return name, (device or None), None
    label = getattr(engine, "name", None)  # a mixle ComputeEngine object (NumpyEngine, TorchEngine)
    if isinstance(label, str):
        where = getattr(engine, "device", None)
        return label.lower(), (None if where is None else str(where)), getattr(engine, "dtype", None)
    raise ValueError(f"engine= must be an engine name ({', '.join(EM_ENGINES)}; 'torch:cpu', 'torch:cuda', "
                     f"'torch:cuda:<i>') or a mixle compute engine, got {type(engine).__name__} {engine!r}")


def engine_hint(backend: Any) -> str:
    """When ``backend=`` was given a compute engine's name, a sentence saying that ``engine=`` takes it (else "")."""
    if isinstance(backend, str) and backend.split(":")[0].strip().lower() in EM_ENGINES:
        return (f". {backend!r} is a compute engine (what runs the E-step): pass engine={backend!r}; backend= "
                "names the transport that runs the chunks")
    return ""


def _backend_hint(engine: Any) -> str:
    """When ``engine=`` was given a transport's name, say that ``backend=`` takes it."""
    from ...registry import is_encoded_data_backend  # only on this error

    if isinstance(engine, str) and is_encoded_data_backend(engine):
        return (f". {engine!r} is a backend (the transport that runs the chunks): pass backend={engine!r}; "
                "engine= names the compute engine of the E-step")
    return ""


def resolve_engine(engine: Any, precision: Any) -> EngineChoice | None:
    """The engine to run the E-step (None: the numpy engine), or ValueError naming what is wrong.

    ``precision`` must be one the engine computes in (:data:`ENGINE_PRECISIONS`); the numpy engine's
    refusal is left to ``options.check_backend_options`` (its message names the backend)."""
    if engine is None:
        return None
    name, device, engine_dtype = _engine_parts(engine)
    if name not in EM_ENGINES:
        raise ValueError(f"unknown EM engine {engine!r}; engines: {', '.join(EM_ENGINES)} (torch also as "
                         f"'torch:cpu', 'torch:cuda' or 'torch:cuda:<i>'){_backend_hint(engine)}")
    if name == "numpy":
        if device not in (None, "cpu"):
            raise ValueError(f"the numpy engine runs on the cpu only, got engine={engine!r}; use engine='torch:cuda'")
        return None
    if device is not None and device != "cpu" and not (device == "cuda" or device.startswith("cuda:")):
        raise ValueError(f"the torch EM engine runs on 'cpu' or 'cuda[:<i>]', got device {device!r} in "
                         f"engine={engine!r}")
    asked = precision if precision is not None else engine_dtype
    chosen = ENGINE_PRECISIONS[name][0] if asked is None else _precision_name(asked)
    if chosen not in ENGINE_PRECISIONS[name]:
        raise ValueError(f"precision={asked!r} is not supported by engine {name!r}: it computes in "
                         f"{' or '.join(ENGINE_PRECISIONS[name])}; pass one of those (or drop precision=)")
    return EngineChoice(name, device, chosen)


def kernel_kind(obj: Any) -> str | None:
    """The torch kernel kind of a built-in estimator or distribution (exact type), else None."""
    return _KIND_OF.get(type(obj))


def torch_kernel_problem(obj: Any) -> str | None:
    """Why the torch engine cannot run the E-step of ``obj`` (estimator or distribution), or None if it can."""
    if obj is None:
        return None
    inner = getattr(obj, "inner", None)  # an engine-bound estimator or model: judge what it wraps
    if inner is not None and getattr(obj, "engine_choice", None) is not None:
        obj = inner
    if type(obj) in (MixtureEstimator, MixtureDistribution):
        parts = obj.estimators if isinstance(obj, MixtureEstimator) else obj.components
        bad = [type(p).__name__ for p in parts if kernel_kind(p) is None]
        if bad:
            return f"a mixture with component(s) {', '.join(sorted(set(bad)))}"
        encodings = sorted({_ENCODING_OF[str(kernel_kind(p))] for p in parts})
        if len(encodings) > 1:
            return f"a mixture whose components read different rows ({', '.join(encodings)})"
        return None
    if kernel_kind(obj) is not None:
        return None
    if isinstance(obj, (MixleEstimator, MixleModel)):  # adapted mixle objects run mixle's own numpy code
        name = type(obj.inner if isinstance(obj, MixleEstimator) else obj.dist).__name__
        ours = [c.__name__ for classes in TORCH_KERNEL_MODELS.values() for c in classes if c.__name__ == name]
        hint = f" (mixle_parallel.{name} has one)" if ours or name.startswith("Mixture") else ""
        return f"mixle's {name}{hint}"
    return type(obj).__name__


def supported_names() -> str:
    """The estimator names the torch engine has kernels for (for error messages)."""
    names = [classes[0].__name__ for classes in TORCH_KERNEL_MODELS.values()]
    return ", ".join(names) + " and MixtureEstimator of them"
