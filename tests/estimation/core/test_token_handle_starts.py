"""StreamingTokenEncodedData's fold methods read what they are given: ``prev_estimate`` starts the training,
``rng`` draws the initial parameters (one process, no process group)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

from mixle_parallel.executors.torch.streaming_tokens import StreamingTokenEncodedData  # noqa: E402
from tests.torch import _streaming_scenarios as sc  # noqa: E402


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)


class _Estimator:
    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.lr, self.device = module, sc.LR, "cpu"


def _params(model: object) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}  # type: ignore[attr-defined]


def _other_start() -> torch.nn.Module:
    torch.manual_seed(1)
    return sc.TinyNextTokenLM()


def test_prev_estimate_is_where_training_starts():
    handle = StreamingTokenEncodedData(sc.TOKENS, block=sc.BLOCK, batch_size=sc.BATCH, epochs=1)
    via_estimator = handle.pysp_seq_estimate(_Estimator(_other_start()), None)
    via_prev = handle.pysp_seq_estimate(_Estimator(sc.fresh_model()), SimpleNamespace(module=_other_start()))
    from_fresh = handle.pysp_seq_estimate(_Estimator(sc.fresh_model()), None)
    for name, value in _params(via_prev).items():
        torch.testing.assert_close(value, _params(via_estimator)[name], rtol=0, atol=0)  # the same start: same bits
        assert not torch.equal(value, _params(from_fresh)[name])
    with pytest.raises(TypeError, match="prev_estimate must carry a torch.nn.Module"):
        handle.pysp_seq_estimate(_Estimator(sc.fresh_model()), object())


def test_rng_draws_the_start_and_none_keeps_the_module():
    handle = StreamingTokenEncodedData(sc.TOKENS, block=sc.BLOCK, batch_size=sc.BATCH)
    kept = handle.pysp_seq_initialize(_Estimator(sc.fresh_model()), None, 0.5)
    first = handle.pysp_seq_initialize(_Estimator(sc.fresh_model()), np.random.RandomState(3), 0.5)
    same = handle.pysp_seq_initialize(_Estimator(sc.fresh_model()), np.random.RandomState(3), 0.5)
    other = handle.pysp_seq_initialize(_Estimator(sc.fresh_model()), np.random.RandomState(4), 0.5)
    for name, value in _params(kept).items():
        torch.testing.assert_close(value, sc.fresh_model().state_dict()[name])
        assert torch.equal(_params(first)[name], _params(same)[name])
        assert not torch.equal(_params(first)[name], _params(other)[name])
        assert not torch.equal(_params(first)[name], value)
    with pytest.raises(ValueError, match="has none; pass rng=None"):
        handle.pysp_seq_initialize(_Estimator(torch.nn.Sequential(torch.nn.Flatten())), 1, 0.5)
