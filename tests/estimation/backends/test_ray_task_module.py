"""The ray backend over a Ray module with tasks and an object store but no cluster view (mixle's minimum)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

from mixle_parallel.executors.estimation.backends.ray import RayEncodedData
from mixle_parallel.executors.estimation.backends.ray_tasks import RayTaskRunner
from tests.estimation.backends import em_case


def _stand_in(initialized: bool) -> tuple[SimpleNamespace, dict[str, Any]]:
    """A ray module that runs each remote task inline: init/shutdown/put/remote/get, no cluster_resources."""
    state: dict[str, Any] = {"up": initialized, "init": 0, "shutdown": 0, "puts": 0, "tasks": 0}

    def init(**kwargs: Any) -> None:
        state["up"], state["init"] = True, state["init"] + 1

    def shutdown() -> None:
        state["up"], state["shutdown"] = False, state["shutdown"] + 1

    def put(value: Any) -> SimpleNamespace:
        state["puts"] += 1
        return SimpleNamespace(value=value)

    def remote(fn: Any) -> SimpleNamespace:
        def call(*args: Any) -> Any:
            state["tasks"] += 1
            return fn(*(a.value if isinstance(a, SimpleNamespace) else a for a in args))
        return SimpleNamespace(remote=call)

    module = SimpleNamespace(is_initialized=lambda: state["up"], init=init, shutdown=shutdown, put=put,
                             remote=remote, get=lambda refs: list(refs))
    return module, state


def test_an_owned_runtime_starts_once_and_is_released_once(monkeypatch):
    ray, state = _stand_in(initialized=False)
    monkeypatch.setitem(sys.modules, "ray", ray)  # one key: patch.dict clears sys.modules on exit
    handle = RayEncodedData(em_case.data()[:90], estimator=em_case.estimator(), num_partitions=3)
    assert isinstance(handle.runner, RayTaskRunner) and (state["init"], state["puts"]) == (1, 3)
    assert handle.num_chunks == 3 and len(handle) == 90
    handle.close()
    handle.close()
    assert state["shutdown"] == 1 and handle.num_chunks == 0


def test_a_shared_runtime_is_never_shut_down(monkeypatch):
    ray, state = _stand_in(initialized=True)
    monkeypatch.setitem(sys.modules, "ray", ray)  # one key: patch.dict clears sys.modules on exit
    RayEncodedData(em_case.data()[:20], estimator=em_case.estimator(), num_partitions=1).close()
    assert state["init"] == 0 and state["shutdown"] == 0


def test_a_fit_on_the_task_runner_has_the_local_bits(monkeypatch):
    reference = em_case.reference()
    ray, state = _stand_in(initialized=True)
    monkeypatch.setitem(sys.modules, "ray", ray)  # one key: patch.dict clears sys.modules on exit
    assert em_case.run("ray", None) == reference
    assert state["tasks"] >= 16 * 12  # every chunk of every pass ran as a task
