"""No side doors into EM (issue 23 item 6): a factory that starts processes undeclared is never admitted as
one local process, and a registration over a built-in leaves every other name working and is certified under
an identity of its own, never under the built-in's certificate."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from mixle_parallel.contracts import NotAdmittedError
from mixle_parallel.executors.estimation import GaussianEstimator, encoded_data
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
from mixle_parallel.executors.estimation.handle import handle_from_runner
from mixle_parallel.executors.registry import (
    get_encoded_data_backend,
    register_encoded_data_backend,
    unregister_encoded_data_backend,
)
from mixle_parallel.verification.keys import TrustStore

X = np.random.default_rng(7).normal(size=200)
EST = GaussianEstimator()


@pytest.fixture
def spawner() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A third-party backend ``sd_spawner`` whose factory starts a worker process it never declares and
    whose handle reports one worker (so nothing it says gives the process away)."""
    started: list[subprocess.Popen[bytes]] = []
    closed: list[bool] = []

    def factory(data: Any, **params: Any) -> Any:
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        handle = handle_from_runner(LocalChunkRunner(1), data, **params)
        close = handle.close

        def close_and_record() -> None:
            closed.append(True)
            close()

        handle.close = close_and_record
        return handle

    factory.closed = closed  # type: ignore[attr-defined]
    register_encoded_data_backend("sd_spawner", factory)
    yield started
    unregister_encoded_data_backend("sd_spawner")
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_factory_that_starts_an_undeclared_process_is_not_admitted_as_local(spawner):
    with pytest.raises(NotAdmittedError, match=r"'sd_spawner' started 1 process\(es\) .* admitted as one local"):
        encoded_data(X, estimator=EST, backend="sd_spawner")
    assert len(spawner) == 1 and get_encoded_data_backend("sd_spawner").closed == [True]


def test_declared_worker_processes_without_a_world_are_refused_before_the_factory_runs(tmp_path, monkeypatch):
    # a third party's backend is certified on the spot where the policy allows (issue 35): here it does not
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    TrustStore().set_policy("off")
    calls: list[dict[str, Any]] = []

    def factory(data: Any, **params: Any) -> Any:
        calls.append(params)
        return handle_from_runner(LocalChunkRunner(1), data, **params)

    register_encoded_data_backend("sd_declared", factory, worker_processes=True)
    try:
        with pytest.raises(ValueError, match="declares worker_processes=True but no planned_workers"):
            encoded_data(X, estimator=EST, backend="sd_declared")
        assert calls == []  # refused before anything could start
        with pytest.raises(NotAdmittedError, match="em_sd_declared"):  # num_workers= is its world: certify it
            encoded_data(X, estimator=EST, backend="sd_declared", num_workers=2)
        assert calls == []
    finally:
        unregister_encoded_data_backend("sd_declared")


@pytest.fixture
def restore_builtins() -> Iterator[None]:
    """Put the built-in ``local`` and ``mp`` back after a test replaces them."""
    saved = {name: get_encoded_data_backend(name) for name in ("local", "mp")}
    yield
    for name, factory in saved.items():
        register_encoded_data_backend(name, factory, override=True)


def test_replacing_local_leaves_its_aliases_and_the_other_built_ins_working(restore_builtins):
    ran: list[int] = []

    def replacement(data: Any, **params: Any) -> Any:  # declares nothing: its workers may be processes
        ran.append(1)
        return handle_from_runner(LocalChunkRunner(1), data, **params)

    register_encoded_data_backend("local", replacement, override=True)
    with encoded_data(X, estimator=EST) as h:  # the replacement under its own name
        assert ran == [1] and h.admission.mode == "local"
    with encoded_data(X, estimator=EST, backend="threads", num_workers=2) as h:  # the built-in's alias
        assert ran == [1] and h.num_workers == 2 and h.admission.executor == "em_local"


def test_an_alias_of_a_replaced_built_in_runs_and_is_certified_as_the_built_in(restore_builtins):
    def threads(data: Any, **params: Any) -> Any:
        return handle_from_runner(LocalChunkRunner(params.get("num_workers") or 1), data, **params)

    register_encoded_data_backend("mp", threads, override=True, worker_processes=False)
    with encoded_data(X, estimator=EST, backend="processes", num_workers=2) as h:
        assert h.backend == "mp" and h.admission.executor == "em_mp" and h.admission.mode == "certified"
    with encoded_data(X, estimator=EST, backend="mp", num_workers=2) as h:  # the replacement: threads here
        assert h.backend == "local" and h.admission.mode == "local"


def test_a_replacement_is_certified_under_its_own_identity_never_the_built_ins(restore_builtins):
    builtin_mp = get_encoded_data_backend("mp")
    with encoded_data(X, estimator=EST, backend="mp", num_workers=2) as h:
        builtin = h.admission
    assert builtin.executor == "em_mp" and builtin.mode == "certified"

    def replacement(data: Any, **params: Any) -> Any:  # the same engine, but third-party code all the same
        return builtin_mp(data, **params)

    register_encoded_data_backend("mp", replacement, override=True, planned_workers=lambda o: o.num_workers or 1)
    with encoded_data(X, estimator=EST, backend="mp", num_workers=2) as h:
        replaced = h.admission
    assert replaced.executor == f"em_mp[{__name__}.{replacement.__qualname__}]".lower()
    assert replaced.mode == "certified" and replaced.certificate_id != builtin.certificate_id
