"""Every public EM entry point refuses an unknown keyword, and every option on a backend that does not honour it.

The options walked are read from the options objects themselves (``EncodedDataOptions``,
``VerificationOptions``), so an option added later must get a sample value here or this test fails.
Nothing here starts a worker: every refusal comes before one would.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import numpy as np
import pytest

from mixle_parallel.contracts import Resources
from mixle_parallel.executors.estimation import (
    DaskEncodedData,
    GaussianEstimator,
    LocalEncodedData,
    MixtureEstimator,
    ModelParallelEncodedData,
    MPEncodedData,
    SparkEncodedData,
    auto_parallel_estimator,
    encoded_data,
    fit,
    optimize,
    plan,
    stochastic_em,
)
from mixle_parallel.executors.estimation.backends.backend_declaration import backend_declaration, builtin_declarations
from mixle_parallel.executors.estimation.backends.builtin_backends import BUILTIN_ENCODED_DATA_BACKENDS
from mixle_parallel.executors.estimation.backends.lightning import LightningEncodedData
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
from mixle_parallel.executors.estimation.backends.mpi import MPIEncodedData
from mixle_parallel.executors.estimation.backends.ray import RayEncodedData
from mixle_parallel.executors.estimation.backends.torchrun import TorchRunEncodedData
from mixle_parallel.executors.estimation.handle import handle_from_runner
from mixle_parallel.executors.estimation.options import option_names, verification_names
from mixle_parallel.executors.registry import register_encoded_data_backend, unregister_encoded_data_backend

X = np.random.default_rng(0).normal(size=120)
EST = GaussianEstimator()
BOGUS = "totally_bogus_option"

SAMPLES: dict[str, Any] = {
    "estimator": EST, "model": None, "encoder": None, "placement": plan(X, estimator=EST, num_chunks=2),
    "resources": Resources.local(2), "engine": "torch", "precision": "fp64", "num_chunks": 2, "sub_chunks": 2,
    "num_workers": 2, "client": object(), "comm": object(), "root": 1, "root_only": True, "parallel_chunks": True,
    "chunk_workers": 2, "batch_size": 10, "shuffle": True, "seed": 1, "chunk_size": 10,
}
"""A value other than the default for every ``EncodedDataOptions`` field (the handle's own keep theirs)."""

CLASSES: dict[str, Any] = {
    "local": LocalEncodedData, "mp": MPEncodedData, "dask": DaskEncodedData, "spark": SparkEncodedData,
    "mpi": MPIEncodedData, "torchrun": TorchRunEncodedData, "ray": RayEncodedData, "lightning": LightningEncodedData,
    "model_parallel": ModelParallelEncodedData,
}
"""The reference handle class of each built-in backend (mixle's names)."""


def test_every_option_has_a_sample_and_every_backend_a_class():
    assert set(SAMPLES) == set(option_names()), "a new EncodedDataOptions field needs a sample value here"
    assert set(CLASSES) == set(BUILTIN_ENCODED_DATA_BACKENDS), "a new built-in backend needs its handle class here"


def _entry_points(backend: str) -> dict[str, Any]:
    """Every public way to make a handle on ``backend`` from rows, as ``call(**keywords)``."""
    est = MixtureEstimator([EST] * 2)
    calls: dict[str, Any] = {
        "encoded_data": lambda **kw: encoded_data(X, backend=backend, **{"estimator": EST, **kw}),
        "fit": lambda **kw: fit(X, est, max_its=1, backend=backend, **kw),
        "optimize": lambda **kw: optimize(X, est, max_its=1, backend=backend, **kw),
        "stochastic_em": lambda **kw: stochastic_em(X, est, backend=backend, **kw),
    }
    cls = CLASSES[backend]
    calls[cls.__name__] = lambda **kw: cls(X, **{"estimator": EST, **kw})
    return calls


def _walk(backend: str) -> list[tuple[str, str]]:
    honoured = backend_declaration(backend).options
    assert honoured is not None, f"built-in backend {backend!r} declares nothing"
    return [(backend, name) for name in option_names() if name not in honoured]


UNHONOURED = [pair for backend in BUILTIN_ENCODED_DATA_BACKENDS for pair in _walk(backend)]


@pytest.mark.parametrize("backend, option", UNHONOURED)
def test_an_option_is_refused_by_every_entry_point_of_a_backend_that_does_not_honour_it(backend, option):
    others = [b for b, opts in builtin_declarations(BUILTIN_ENCODED_DATA_BACKENDS).items() if opts and option in opts]
    expected = (f"option {option}= is not honoured by backend '{backend}'; "
                + (f"backends honouring it: {', '.join(sorted(others))}" if others else "no backend honours it"))
    before = set(multiprocessing.active_children())
    for where, call in _entry_points(backend).items():
        if (where == "stochastic_em" and option in ("batch_size", "shuffle", "seed")) or \
                (where in ("fit", "optimize") and option == "seed"):
            continue  # their own options of that name (the batches; the start's seed), not the handle's
        with pytest.raises(ValueError) as info:
            call(**{option: SAMPLES[option]})
        assert expected in str(info.value), (where, str(info.value))
    assert set(multiprocessing.active_children()) <= before


@pytest.mark.parametrize("backend", sorted(BUILTIN_ENCODED_DATA_BACKENDS))
def test_an_unknown_keyword_is_refused_by_every_entry_point_naming_it(backend):
    for where, call in _entry_points(backend).items():
        with pytest.raises((TypeError, ValueError), match=BOGUS) as info:
            call(**{BOGUS: 123})
        assert isinstance(info.value, ValueError), (where, info.value)  # an option error, whatever else it is


def test_an_unknown_keyword_is_refused_by_the_other_entry_points():
    with encoded_data(X, estimator=EST) as handle:
        for call in (lambda: fit(handle, EST, **{BOGUS: 123}), lambda: optimize(handle, EST, **{BOGUS: 123}),
                     lambda: stochastic_em(handle, EST, **{BOGUS: 123}), lambda: encoded_data(handle, **{BOGUS: 1})):
            with pytest.raises(ValueError, match=BOGUS):
                call()
    for call in (lambda: handle_from_runner(LocalChunkRunner(1), X, estimator=EST, **{BOGUS: 123}),
                 lambda: ModelParallelEncodedData(X, estimator=EST, **{BOGUS: 123}),
                 lambda: plan(X, estimator=EST, **{BOGUS: 123}),
                 lambda: auto_parallel_estimator(EST, None, **{BOGUS: 123}),
                 lambda: register_encoded_data_backend("walk_bogus", lambda data, **kw: None, **{BOGUS: 123})):
        with pytest.raises(TypeError, match=BOGUS):
            call()


@pytest.fixture
def declared_probe():
    def factory(data: Any, *, num_workers: int | None = None, **params: Any) -> Any:
        return handle_from_runner(LocalChunkRunner(num_workers or 1), data, **params)

    register_encoded_data_backend("walk_probe", factory, options={"num_workers"}, worker_processes=False)
    yield "walk_probe"
    unregister_encoded_data_backend("walk_probe")


def test_a_registered_backend_refuses_what_it_does_not_declare(declared_probe):
    declared = builtin_declarations(BUILTIN_ENCODED_DATA_BACKENDS)
    honoured = backend_declaration(declared_probe).options
    for option in option_names():
        if option in honoured:
            continue
        others = sorted(b for b, opts in declared.items() if opts and option in opts)
        with pytest.raises(ValueError, match=f"option {option}= is not honoured by backend 'walk_probe'; "
                                             f"backends honouring it: {', '.join(others)}"):
            encoded_data(X, estimator=EST, backend=declared_probe, **{option: SAMPLES[option]})
    with encoded_data(X, estimator=EST, backend=declared_probe, num_workers=3) as handle:
        assert handle.num_workers == 3


def test_every_verification_control_is_refused_by_a_handle_that_cannot_apply_it():
    class Plain:  # a third party's handle with the fold methods only: no audit, no ledger
        num_workers = 1

        def pysp_seq_log_density_sum(self, estimate): ...
        def pysp_seq_estimate(self, estimator, prev_estimate): ...
        def pysp_seq_initialize(self, estimator, rng, p): ...
        def pysp_stream_accumulate(self, estimator, model): ...
        def close(self): ...

    samples = {"audit": True, "audit_rate": 0.5, "audit_policy": "warn", "audit_seed": 3, "ledger": "x.jsonl",
               "fault_injector": object()}
    assert set(samples) | {"admission"} == set(verification_names())
    register_encoded_data_backend("walk_plain", lambda data, **kw: Plain(), worker_processes=False)
    try:
        for control, value in samples.items():
            with pytest.raises(ValueError, match=f"drop {control}"):
                encoded_data(X, estimator=EST, backend="walk_plain", **{control: value})
    finally:
        unregister_encoded_data_backend("walk_plain")
