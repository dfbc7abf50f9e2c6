"""mixle 0.8.2's ``planner`` and ``torch_neural`` names: each importable from our module of the same name and
from ``mixle_parallel``, as one object (read from mixle's own ``__all__``, so a name mixle adds shows up here)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

import mixle_parallel

MODULES = ("planner", "torch_neural")


def _mixle_names(module: str) -> list[str]:
    spec = importlib.util.find_spec("mixle")
    if spec is None or spec.origin is None:
        pytest.skip("mixle 0.8.2 (the mixle extra) is not installed")
    tree = ast.parse((Path(spec.origin).parent / "utils" / "parallel" / f"{module}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [n for n in ast.literal_eval(node.value) if not n.startswith("_")]
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]


@pytest.mark.parametrize("module", MODULES)
def test_every_mixle_name_is_importable_from_both_paths(module: str) -> None:
    ours = importlib.import_module(f"mixle_parallel.{module}")
    names = _mixle_names(module)
    assert names
    for name in names:
        assert name in ours.__all__, (module, name)
        assert getattr(mixle_parallel, name) is getattr(ours, name), (module, name)


def test_the_fold_protocol_is_structural() -> None:
    from mixle_parallel.planner import EncodedFold

    class Handle:
        def pysp_seq_log_density_sum(self, estimate): ...
        def pysp_seq_estimate(self, estimator, prev_estimate): ...
        def pysp_seq_initialize(self, estimator, rng, p): ...
        def pysp_stream_accumulate(self, estimator, model): ...

    class NoStreaming:
        def pysp_seq_log_density_sum(self, estimate): ...
        def pysp_seq_estimate(self, estimator, prev_estimate): ...
        def pysp_seq_initialize(self, estimator, rng, p): ...

    assert isinstance(Handle(), EncodedFold)
    assert not isinstance(NoStreaming(), EncodedFold)


def test_our_handles_are_encoded_folds() -> None:
    import numpy as np

    from mixle_parallel import GaussianEstimator, encoded_data
    from mixle_parallel.planner import EncodedFold

    with encoded_data(np.arange(10.0), estimator=GaussianEstimator(), backend="local") as handle:
        assert isinstance(handle, EncodedFold)
