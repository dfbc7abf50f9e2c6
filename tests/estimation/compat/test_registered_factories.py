"""mixle 0.8.2's backend registry: a registered factory receives the caller's estimator, model and encoder by
identity and sub_chunks as given; names are normalized (case as in mixle, plus '-' == '_' and spaces)."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel import encoded_data
from mixle_parallel.planner import available_encoded_data_backends, register_encoded_data_backend


class _Seen:
    calls: list[dict] = []


def _recording_factory(data, **params):
    _Seen.calls.append(dict(params, data=data))
    return encoded_data(data, backend="local", estimator=params.get("estimator"), num_chunks=2)


def _register(name: str) -> None:
    register_encoded_data_backend(name, _recording_factory, override=True)


@pytest.mark.parametrize("flavour", ["ours", "mixle"])
def test_a_registered_factory_gets_the_callers_objects_by_identity_and_sub_chunks_as_given(flavour):
    if flavour == "mixle":
        mstats = pytest.importorskip("mixle.stats")
        est = mstats.GaussianEstimator()
        model = mstats.GaussianDistribution(0.0, 1.0)
    else:
        from mixle_parallel import GaussianDistribution, GaussianEstimator

        est, model = GaussianEstimator(), GaussianDistribution(0.0, 1.0)
    encoder = object()
    data = np.arange(20.0)
    _register("dropin_recorder")
    _Seen.calls = []
    with encoded_data(data, backend="dropin_recorder", estimator=est, model=model, encoder=encoder, sub_chunks=3):
        pass
    (seen,) = _Seen.calls
    assert seen["estimator"] is est and seen["model"] is model and seen["encoder"] is encoder
    assert seen["sub_chunks"] == 3 and seen["data"] is data


def test_names_are_normalized_case_insensitively_as_in_mixle():
    _register("DropIn-Mixed")
    assert "dropin_mixed" in available_encoded_data_backends()
    _Seen.calls = []
    for spelling in ("dropin-mixed", "DROPIN_MIXED", " DropIn-Mixed "):
        with encoded_data(np.arange(6.0), backend=spelling, estimator=None):
            pass
    assert len(_Seen.calls) == 3
