"""A third party's EM backend is first-class at the admission gate (issue 35 item 2).

The backend lives in a module outside the repository and the current directory (as a user's own package would),
runs its chunks in worker processes, and is registered with ``register_encoded_data_backend``. Where the trust
store's policy allows, its first multi-worker fit certifies it on the spot, as the built-in ``mp``; where the
policy forbids that, the refusal prints the certify command once, and that command, run literally in a shell,
certifies it (``--import`` of the module and its folder on ``PYTHONPATH``); after an edit of the module the
refusal says that a stored certificate exists but its code digest differs.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mixle_parallel.contracts import NotAdmittedError
from mixle_parallel.executors import unregister_encoded_data_backend
from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, fit
from mixle_parallel.verification import CertificateStore
from mixle_parallel.verification.keys import TrustStore

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
NAME = "toy_em"
PLUGIN = '''
"""toy_em: chunks run in a pool of spawned worker processes (a third party's backend)."""
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from mixle_parallel import apply_chunk_fn, handle_from_runner, register_encoded_data_backend


class PoolRunner:
    name = "toy_em"

    def __init__(self, num_workers):
        self.num_workers = num_workers
        self._pool = ProcessPoolExecutor(num_workers, mp_context=get_context("spawn"))
        self._chunks = []

    def scatter(self, chunks):
        self._chunks = list(chunks)

    def map_chunks(self, fn, payload, chunk_ids=None):
        ids = list(range(len(self._chunks))) if chunk_ids is None else sorted(chunk_ids)
        blocks = [[i for i in ids if i * self.num_workers // max(1, len(ids)) == w] for w in range(self.num_workers)]
        futures = [(b, self._pool.submit(apply_chunk_fn, fn, payload, b, {i: self._chunks[i] for i in b}.__getitem__))
                   for b in blocks if b]
        results = {}
        for block, future in futures:
            results.update(zip(block, future.result(timeout=120)))
        return [results[i] for i in ids]

    def close(self):
        self._pool.shutdown(wait=True)


def toy_em(data, *, num_workers=None, **options):
    runner = PoolRunner(num_workers or 2)
    try:
        return handle_from_runner(runner, data, **options)
    except BaseException:
        runner.close()
        raise


register_encoded_data_backend("toy_em", toy_em, options={"num_workers"}, worker_processes=True,
                              planned_workers=lambda options: options.num_workers or 2)
'''
X = np.concatenate([np.random.default_rng(1).normal(-2.0, 1.0, 600), np.random.default_rng(2).normal(3.0, 0.5, 600)])


def _fit() -> object:
    return fit(X, MixtureEstimator([GaussianEstimator()] * 2), max_its=3, delta=None, seed=1, chunk_size=100,
               backend=NAME, num_workers=2)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``toy_em`` imported from its own folder (not the repository, not the current directory), then dropped."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "toy_em_backend.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    sys.modules.pop("toy_em_backend", None)
    importlib.import_module("toy_em_backend")
    yield folder / "toy_em_backend.py"
    unregister_encoded_data_backend(NAME)
    sys.modules.pop("toy_em_backend", None)


def test_a_third_party_backend_is_certified_on_the_spot(plugin, capfd):
    result = _fit()
    assert result.admission == "certified"
    assert capfd.readouterr().err.count("certifying em_toy_em") == 1
    assert [c.executor for _, c, _ in CertificateStore().entries()] == ["em_toy_em"]
    assert _fit().admission == "certified" and "certifying" not in capfd.readouterr().err  # stored, found


def test_the_refusal_names_a_command_that_runs_as_printed(plugin, tmp_path):
    TrustStore().set_policy("off")
    with pytest.raises(NotAdmittedError) as refused:
        _fit()
    message = str(refused.value)
    commands = re.findall(r"`([^`]*mixle-parallel certify[^`]*)`", message)
    assert len(commands) == 1 and message.count("mixle-parallel certify") == 1, message
    command = commands[0]
    assert f"PYTHONPATH={plugin.parent}:" in command and "--import toy_em_backend --backend toy_em" in command
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(command, shell=True, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _fit().admission == "certified"  # the certificate it stored admits the fit

    plugin.write_text(plugin.read_text() + "\n# a one-line edit\n")
    with pytest.raises(NotAdmittedError) as stale:
        _fit()
    text = str(stale.value)
    assert "a certificate of em_toy_em is stored" in text and "code digest differs" in text
    assert "check 'source_digest' failed" in text and text.count("mixle-parallel certify") == 1
