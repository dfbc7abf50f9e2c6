"""The dask backend over a client that only submits and gathers (as mixle 0.8.2 accepts), and handle identity."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")

from mixle_parallel import DaskEncodedData, LocalEncodedData, MPEncodedData, encoded_data  # noqa: E402
from mixle_parallel.executors.estimation.backends.dask_tasks import (  # noqa: E402
    DaskTaskRunner,
    scheduler_workers,
)
from tests.estimation.backends import em_case  # noqa: E402


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value


class InlineClient:
    """A stand-in client: runs each task at submit, lists two workers, takes no n_workers keyword."""

    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, fn: Any, *args: Any, pure: bool = True, **kwargs: Any) -> _Done:
        self.submitted += 1
        return _Done(fn(*args, **kwargs))

    def gather(self, futures: list[_Done]) -> list[Any]:
        return [f.value for f in futures]

    def scheduler_info(self) -> dict[str, Any]:
        return {"workers": {"w-0": {}, "w-1": {}}}


def test_a_submit_gather_client_fits_the_same_bits_as_local():
    client = InlineClient()
    assert em_case.run("dask", None, client=client) == em_case.reference()
    assert client.submitted >= 16  # one task per chunk and pass: the stand-in really ran them


def test_handles_have_mixles_len_and_are_instances_of_their_backends_class():
    rows = em_case.data()[:300]
    with encoded_data(rows, estimator=em_case.estimator(), backend="dask", client=InlineClient(),
                      num_chunks=3, admission="unverified") as enc:
        assert len(enc) == 300 and isinstance(enc, DaskEncodedData)
        assert isinstance(enc.runner, DaskTaskRunner) and enc.num_workers == 2
        assert not isinstance(enc, MPEncodedData) and not isinstance(enc, LocalEncodedData)
    with encoded_data(rows, estimator=em_case.estimator()) as local:
        assert isinstance(local, LocalEncodedData) and not isinstance(local, DaskEncodedData)


def test_a_client_missing_methods_or_workers_is_refused_before_anything_runs():
    class NoGather:
        def submit(self, fn: Any, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("nothing may be submitted")

        def scheduler_info(self) -> dict[str, Any]:
            return {"workers": {"w": {}}}

    with pytest.raises(TypeError, match=r"has no gather\(\)"):
        encoded_data([1.0, 2.0], estimator=em_case.estimator(), backend="dask", client=NoGather())
    empty = InlineClient()
    empty.scheduler_info = lambda: {"workers": {}}  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="lists no workers"):
        DaskTaskRunner(empty)
    with pytest.raises(ValueError, match="has 2 worker"):
        DaskTaskRunner(InlineClient(), num_workers=3)
    assert scheduler_workers(InlineClient()) == ["w-0", "w-1"]
