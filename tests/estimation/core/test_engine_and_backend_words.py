"""Two words kept apart, as in mixle 0.8.2's encoded_data: ``backend=`` the transport, ``engine=`` the compute engine.

Each option given the other's name is refused with a pointer to the right keyword, never an unknown-name dead end.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from mixle_parallel.executors.estimation.api import encoded_data
from mixle_parallel.executors.estimation.em_pass.engine_choice import EM_ENGINES
from mixle_parallel.executors.estimation.models import GaussianEstimator


def test_both_keywords_are_mixles():
    mixle = pytest.importorskip("mixle.utils.parallel", reason="mixle is the optional [mixle] extra")
    ours, theirs = inspect.signature(encoded_data).parameters, inspect.signature(mixle.encoded_data).parameters
    assert {"engine", "backend"} <= set(ours) and {"engine", "backend"} <= set(theirs)
    assert EM_ENGINES == ("numpy", "torch")


@pytest.mark.parametrize("name", ["mp", "spark", "local"])
def test_a_backend_given_as_engine_points_at_backend(name):
    with pytest.raises(ValueError, match=rf"unknown EM engine '{name}'.*pass backend='{name}'"):
        encoded_data(np.arange(8.0), estimator=GaussianEstimator(), engine=name)


@pytest.mark.parametrize("name", ["numpy", "torch", "torch:cuda"])
def test_an_engine_given_as_backend_points_at_engine(name):
    with pytest.raises(ValueError, match=rf"unknown encoded-data backend '{name}'.*pass engine='{name}'"):
        encoded_data(np.arange(8.0), estimator=GaussianEstimator(), backend=name)


def test_a_name_of_neither_gets_no_pointer():
    with pytest.raises(ValueError, match="unknown EM engine 'nope'") as raised:
        encoded_data(np.arange(8.0), estimator=GaussianEstimator(), engine="nope")
    assert "pass backend" not in str(raised.value)
    with pytest.raises(ValueError, match="unknown encoded-data backend 'nope'") as raised:
        encoded_data(np.arange(8.0), estimator=GaussianEstimator(), backend="nope")
    assert "pass engine" not in str(raised.value)
