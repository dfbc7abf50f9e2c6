"""Each EM option is honoured by the backend that receives it or refused, before any worker starts (issue 22).

One test per hole that used to let an option vanish: a handle reused with other controls, options
that a path never read, keywords swallowed by ``**_``, the planner's ignored arguments, a
registration that declared nothing, ``resources=`` read for its length only.
"""

from __future__ import annotations

import sys
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from mixle_parallel.contracts import DeviceSpec, NotAdmittedError, Resources
from mixle_parallel.executors.estimation import (
    EncodedDataControlConflictError,
    EncodedDataOptions,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    ModelParallelEncodedData,
    MPEncodedData,
    UnrealizedModelPlacementError,
    VerificationOptions,
    auto_parallel_estimator,
    encoded_data,
    fit,
    optimize,
    plan,
    stochastic_em,
)
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
from mixle_parallel.executors.estimation.handle import handle_from_runner
from mixle_parallel.executors.registry import (
    get_encoded_data_backend,
    register_encoded_data_backend,
    unregister_encoded_data_backend,
)
from mixle_parallel.verification.keys import TrustStore

X = np.random.default_rng(5).normal(size=400)
EST = GaussianEstimator()
MIX = MixtureEstimator([EST] * 2)


def _mixture(k: int) -> MixtureDistribution:
    return MixtureDistribution([GaussianDistribution(float(i), 1.0) for i in range(k)], np.full(k, 1.0 / k))


def _devices(n: int, **kwargs: Any) -> Resources:
    return Resources(tuple(DeviceSpec(f"cpu{i}", **kwargs) for i in range(n)))


# ---- a handle reused with controls: refused on every path ---------------------------------------------
def test_fit_optimize_and_stochastic_em_refuse_controls_for_an_existing_handle():
    with encoded_data(X, estimator=EST) as handle:
        for call in (lambda: fit(handle, MIX, backend="mp", num_workers=8),
                     lambda: optimize(handle, MIX, 1, None, 0.1, 1, "mp", 8)):
            with pytest.raises(EncodedDataControlConflictError, match="num_workers, backend"):
                call()
        with pytest.raises(EncodedDataControlConflictError, match="num_workers"):
            stochastic_em(handle, EST, num_workers=2)
        with pytest.raises(EncodedDataControlConflictError, match="backend"):
            stochastic_em(handle, EST, backend="mp")
        with pytest.raises(EncodedDataControlConflictError, match="audit_rate"):
            stochastic_em(handle, EST, audit_rate=0.5)
        assert fit(handle, MIX, max_its=2, seed=1).iterations == 2  # bare reuse still works
        assert handle.options.num_workers is None and not hasattr(handle, "controls")


# ---- options objects validated at the edge -------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, text", [
    ({"root_only": "yes"}, TypeError, "root_only must be True or False"),
    ({"num_chunks": 0}, ValueError, "num_chunks must be an int >= 1"),
    ({"num_chunks": 2, "chunk_size": 10}, ValueError, "give num_chunks or chunk_size, not both"),
    ({"num_workers": 2.5}, TypeError, "num_workers must be an int or None"),
    ({"resources": 3}, TypeError, "resources= takes a Resources"),
    ({"extra": {"num_workers": 2}}, ValueError, "extra= holds num_workers"),
])
def test_encoded_data_options_are_checked_where_they_are_made(kwargs, error, text):
    with pytest.raises(error, match=text):
        EncodedDataOptions(**kwargs)


@pytest.mark.parametrize("kwargs, text", [
    ({"audit_policy": "skip_step"}, "audit_policy='skip_step' is not one of 'quarantine', 'raise', 'warn'"),
    ({"audit_rate": 2}, "audit_rate must be a number in"),
    ({"audit": False, "fault_injector": object()}, "audit=False turns the audit off"),
    ({"audit": False, "audit_rate": 0.5}, "audit=False contradicts audit_rate="),
])
def test_verification_options_are_checked_where_they_are_made(kwargs, text):
    with pytest.raises(ValueError, match=text):
        VerificationOptions(**kwargs)


def test_audit_controls_on_a_handle_that_is_not_audited_are_refused_naming_audit():
    for control in ({"fault_injector": object()}, {"audit_rate": 0.5}, {"audit_policy": "warn"}):
        with pytest.raises(ValueError, match=r"off for 1 worker\(s\) by default; pass audit=True"):
            encoded_data(X, estimator=EST, **control)
    assert VerificationOptions(audit_policy="raise").audit_policy == "raise"  # the enum equals its string


# ---- ModelParallelEncodedData and handle_from_runner: mixle's keywords, nothing else ----------------
def test_model_parallel_handle_takes_mixles_keywords_and_refuses_the_rest():
    with ModelParallelEncodedData(X, estimator=MIX, num_workers=2, num_chunks=3, sub_chunks=2) as h:
        assert (h.num_chunks, h.component_workers) == (6, 2)
    with pytest.raises(ValueError, match="option comm= is not honoured by backend 'model_parallel'"):
        ModelParallelEncodedData(X, estimator=MIX, comm=object())
    with pytest.raises(TypeError, match="totally_bogus_option"):
        ModelParallelEncodedData(X, estimator=MIX, totally_bogus_option=123)
    with pytest.raises(TypeError, match="totally_bogus_option"):
        handle_from_runner(LocalChunkRunner(1), X, estimator=EST, totally_bogus_option=123)
    with handle_from_runner(LocalChunkRunner(1), X, EncodedDataOptions(estimator=EST, sub_chunks=4)) as h:
        assert h.num_chunks == 4


# ---- the planner reads what it is given ---------------------------------------------------------------
def test_plan_counts_working_memory_at_the_engines_precision_and_refuses_what_numpy_cannot_compute():
    model, est = _mixture(8), MixtureEstimator([EST] * 8)
    wide = plan(X, model=model, estimator=est, num_chunks=2)
    narrow = plan(X, model=model, estimator=est, num_chunks=2, engine="torch", precision="fp32")
    assert all(n.resident_bytes < w.resident_bytes for n, w in zip(narrow.shards, wide.shards))
    assert plan(X, model=model, estimator=est, num_chunks=2, engine="torch") == wide  # torch fp64: same bytes
    with pytest.raises(ValueError, match="numpy engine computes in float64 only"):
        plan(X, estimator=est, precision="fp32")
    assert plan(X, estimator=EST, num_chunks=2, sub_chunks=3).num_chunks == 6  # the handle's chunks


@pytest.mark.parametrize("components, devices, rows, model_parallel", [
    (5, 4, 100_000, False), (8, 1, 40, False), (12, 4, 40, True), (8, 4, 400, True),
])
def test_auto_parallel_estimator_decides_as_mixle_does(components, devices, rows, model_parallel):
    est = MixtureEstimator([EST] * components)
    if model_parallel:
        with pytest.raises(UnrealizedModelPlacementError) as info:
            auto_parallel_estimator(est, _mixture(components), _devices(devices), n_data=rows)
        assert info.value.plan.is_model_parallel and len(info.value.plan.cuts) == devices
    else:
        chosen, decision = auto_parallel_estimator(est, _mixture(components), _devices(devices), n_data=rows)
        assert chosen is est and not decision.is_model_parallel


def test_n_data_changes_the_decision_at_eight_rows_per_device():
    est = MixtureEstimator([EST] * 3)  # 3 components < 2 x 2 devices
    chosen, decision = auto_parallel_estimator(est, _mixture(3), _devices(2), n_data=16)
    assert chosen is est and not decision.is_model_parallel and decision.rationale
    with pytest.raises(UnrealizedModelPlacementError):
        auto_parallel_estimator(est, _mixture(3), _devices(2), n_data=15)
    assert not auto_parallel_estimator(est, _mixture(3), _devices(2))[1].is_model_parallel  # n_data=None


# ---- resources= honoured: chunks by throughput, memory a limit ---------------------------------------
@pytest.mark.parametrize("backend", ["local", "mp"])
def test_resources_place_chunks_by_throughput_with_the_same_bits(backend):
    fast = Resources((DeviceSpec("a", throughput=3.0), DeviceSpec("b", throughput=1.0)))
    plain = fit(X, MIX, max_its=3, delta=None, seed=2, num_chunks=8)
    with encoded_data(X, estimator=MIX, backend=backend, resources=fast, num_chunks=8, admission="unverified") as h:
        assert h.num_workers == 2
        assert [(s.first_chunk, s.last_chunk) for s in h.placement.shards] == [(0, 6), (6, 8)]
        placed = fit(h, MIX, max_its=3, delta=None, seed=2)
    assert placed.history == plain.history


def test_resources_that_cannot_hold_the_rows_are_refused():
    tiny = Resources((DeviceSpec("a", memory_bytes=64), DeviceSpec("b", memory_bytes=64)))
    with pytest.raises(ValueError, match="resources= cannot hold the data: b: needs 16000 bytes resident, has 64"):
        encoded_data(X, estimator=EST, resources=tiny)


# ---- registration declares; the defaults are safe ------------------------------------------------------
@pytest.fixture
def probe():
    seen: dict[str, Any] = {}

    def factory(data: Any, **params: Any) -> Any:
        seen.update(params)
        return handle_from_runner(LocalChunkRunner(params.get("num_workers") or 1), data, **params)

    yield factory, seen
    unregister_encoded_data_backend("probe_backend")


def test_a_factory_without_planned_workers_runs_the_workers_asked_without_a_warning(probe):
    factory, seen = probe
    register_encoded_data_backend("probe_backend", factory, worker_processes=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with encoded_data(X, estimator=EST, backend="probe_backend", num_workers=2) as h:
            assert seen["num_workers"] == 2 and h.num_workers == 2 and h.admission.mode == "local"


def test_a_backend_that_may_start_processes_is_never_admitted_as_one_local_process(probe, tmp_path, monkeypatch):
    # a third party's backend is certified on the spot where the policy allows (issue 35): here it does not
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    TrustStore().set_policy("off")
    factory, _ = probe
    register_encoded_data_backend("probe_backend", factory)  # declares nothing: its workers may be processes
    with pytest.raises(NotAdmittedError, match="em_probe_backend"):
        encoded_data(X, estimator=EST, backend="probe_backend", num_workers=2)

    def sneaky(data: Any, **params: Any) -> Any:  # starts two workers though it was asked for none
        return handle_from_runner(LocalChunkRunner(2), data, **params)

    register_encoded_data_backend("probe_backend", sneaky, override=True)
    with pytest.raises(NotAdmittedError, match="started 2 worker processes but planned a world of 1"):
        encoded_data(X, estimator=EST, backend="probe_backend")


def test_declarations_come_from_the_registration_or_the_factory(probe):
    factory, _ = probe
    factory.encoded_data_options = frozenset({"num_workers"})  # type: ignore[attr-defined]
    factory.worker_processes = False  # type: ignore[attr-defined]
    factory.planned_workers = lambda options: 3  # type: ignore[attr-defined]
    register_encoded_data_backend("probe_backend", factory)
    with pytest.warns(UserWarning, match="cannot use num_workers=5 here; running 3"):
        encoded_data(X, estimator=EST, backend="probe_backend", num_workers=5).close()
    register_encoded_data_backend("probe_backend", factory, override=True, options={"chunk_workers"})
    with pytest.raises(ValueError, match="option num_workers= is not honoured by backend 'probe_backend'"):
        encoded_data(X, estimator=EST, backend="probe_backend", num_workers=2)
    for bad, text in (({"options": "num_workers"}, "collection of option names"),
                      ({"worker_processes": 1}, "True or False"), ({"planned_workers": 3}, "a function")):
        with pytest.raises(TypeError, match=text):
            register_encoded_data_backend("probe_backend", factory, override=True, **bad)


def test_a_factory_gets_the_callers_objects_and_sub_chunks_as_given(probe):
    factory, seen = probe
    register_encoded_data_backend("probe_backend", factory, worker_processes=False)
    model = _mixture(2)
    with encoded_data(X, estimator=MIX, model=model, backend="probe_backend", num_chunks=2, sub_chunks=3) as h:
        assert seen["estimator"] is MIX and seen["model"] is model and seen["encoder"] is None
        assert (seen["num_chunks"], seen["sub_chunks"]) == (2, 3) and h.num_chunks == 6
    mixle_stats = pytest.importorskip("mixle.stats", reason="the mixle extra (mixle==0.8.2) is not installed")
    theirs = mixle_stats.GaussianEstimator()
    with encoded_data(X, estimator=theirs, backend="probe_backend") as h:
        assert seen["estimator"] is theirs and h.num_rows == len(X)
    mixture = mixle_stats.MixtureEstimator([mixle_stats.GaussianEstimator()] * 2)
    fit(X, mixture, max_its=1, backend="probe_backend")
    assert seen["estimator"] is mixture  # fit passes the caller's object too


def test_replacing_a_built_in_leaves_every_other_backend_working(probe):
    factory, seen = probe
    builtin_mp = get_encoded_data_backend("mp")
    register_encoded_data_backend("mp", factory, override=True, worker_processes=False)
    try:
        with encoded_data(X, estimator=EST, backend="mp", num_workers=2) as h:
            assert seen["num_workers"] == 2 and h.backend == "local"  # the replacement ran
        with encoded_data(X, estimator=EST, backend="local") as h:
            assert h.num_rows == len(X)
        with encoded_data(X, estimator=MIX, backend="model_parallel", num_workers=2) as h:
            assert h.num_rows == len(X)
    finally:
        register_encoded_data_backend("mp", builtin_mp, override=True)
    assert get_encoded_data_backend("mp") is builtin_mp


# ---- engine keywords honoured or refused --------------------------------------------------------------
def test_mp_shutdown_timeout_is_honoured():
    with MPEncodedData(X, estimator=EST, num_workers=1, shutdown_timeout=0.5) as h:
        assert h.runner.shutdown_timeout == 0.5
    with pytest.raises(ValueError, match="shutdown_timeout must be >= 0"):
        encoded_data(X, estimator=EST, backend="mp", num_workers=1, shutdown_timeout=-1)


def test_local_thread_counts_that_contradict_each_other_are_refused():
    with pytest.raises(ValueError, match="num_workers=2 and chunk_workers=3 both set"):
        encoded_data(X, estimator=EST, num_workers=2, chunk_workers=3)
    with pytest.raises(ValueError, match="parallel_chunks=True asks for chunk threads"):
        encoded_data(X, estimator=EST, num_workers=1, parallel_chunks=True)
    with encoded_data(X, estimator=EST, chunk_workers=2) as h:
        assert h.num_workers == 2


def _inline_ray() -> tuple[SimpleNamespace, dict[str, Any]]:
    """A Ray module with tasks and an object store but no cluster view (mixle's minimum), run inline."""
    state: dict[str, Any] = {"up": False, "init": {}}

    def init(**kwargs: Any) -> None:
        state["up"], state["init"] = True, kwargs

    def remote(fn: Any) -> SimpleNamespace:
        return SimpleNamespace(remote=lambda *args: fn(*(a.value if isinstance(a, SimpleNamespace) else a
                                                         for a in args)))

    module = SimpleNamespace(is_initialized=lambda: state["up"], init=init, shutdown=lambda: state.update(up=False),
                             put=lambda value: SimpleNamespace(value=value), remote=remote, get=lambda refs: list(refs))
    return module, state


def test_ray_takes_mixles_client_as_the_address_and_its_task_runner_refuses_actor_options(monkeypatch):
    ray, state = _inline_ray()
    monkeypatch.setitem(sys.modules, "ray", ray)  # one key: patch.dict clears sys.modules on exit
    with encoded_data(X, estimator=EST, backend="ray", client="ray://head:10001") as h:
        assert state["init"]["address"] == "ray://head:10001" and h.num_rows == len(X)
    with pytest.raises(ValueError, match="option\\(s\\) timeout= are not honoured by backend 'ray' over a Ray "
                                         "module without cluster_resources"):
        encoded_data(X, estimator=EST, backend="ray", timeout=5.0)
    with pytest.raises(ValueError, match="client='a' and address='b' both name the Ray cluster"):
        encoded_data(X, estimator=EST, backend="ray", client="a", address="b")


def test_a_task_only_dask_client_refuses_the_resident_runners_options():
    pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")

    class Inline:
        def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
            return SimpleNamespace(value=fn(*args))

        def gather(self, futures: list[Any]) -> list[Any]:
            return [f.value for f in futures]

        def scheduler_info(self) -> dict[str, Any]:
            return {"workers": {"w-0": {}}}

    with pytest.raises(ValueError, match="direct_channel= are not honoured by backend 'dask' over a Inline"):
        encoded_data(X, estimator=EST, backend="dask", client=Inline(), direct_channel=False)
    with encoded_data(X, estimator=EST, backend="dask", client=Inline()) as h:
        assert h.num_rows == len(X)
