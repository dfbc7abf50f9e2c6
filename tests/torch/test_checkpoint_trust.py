"""Signed checkpoint manifests: a recomputed manifest, an unsigned or foreign checkpoint, a rolled-back LATEST.

Each test has a fresh trust store (``MIXLE_PARALLEL_HOME``); "another machine" is a second one.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

from mixle_parallel.executors.torch.checkpoint import load_checkpoint  # noqa: E402
from mixle_parallel.executors.torch.checkpoint_manifest import publish, write_manifest  # noqa: E402
from mixle_parallel.executors.torch.checkpoint_trust import SIGNATURE_NAME, UntrustedCheckpointError  # noqa: E402
from tests.torch.test_checkpoint_local import _build, _params, _save, _step  # noqa: E402


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


class _Payload:
    """A pickle that touches a marker file when unpickled (stands in for arbitrary code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _saved(root: Path):
    model, optimizer, scheduler = _build()
    _step(model, optimizer, scheduler, 0)
    return _save(root, model, optimizer, scheduler, 1).wait()


def _unchanged_after_refusal(root: Path, match: str, **kwargs) -> None:
    fresh = _build(seed=5)
    before = _params(fresh[0])
    with pytest.raises(UntrustedCheckpointError, match=match):
        load_checkpoint(root, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2], **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh[0]), before)) and not fresh[1].state


def test_a_save_is_signed_and_loads(tmp_path):
    gen = _saved(tmp_path / "ck")
    assert (gen / SIGNATURE_NAME).is_file()
    fresh = _build(seed=5)
    assert load_checkpoint(tmp_path / "ck", model=fresh[0], optimizer=fresh[1], scheduler=fresh[2])["generation"] \
        == gen.name


def test_a_pickle_behind_a_recomputed_manifest_never_runs(tmp_path):
    root = tmp_path / "ck"
    gen = _saved(root)
    marker = tmp_path / "pwned"
    (gen / "dcp" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    publish(root, gen.name, write_manifest(gen, world_size=1))  # manifest and LATEST recomputed to match
    _unchanged_after_refusal(root, "differs from the manifest its signature covers")
    assert not marker.exists()


def test_unsigned_and_foreign_checkpoints_need_the_explicit_opt_out(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    gen = _saved(root)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "other-machine"))
    _unchanged_after_refusal(root, "does not trust")
    (gen / SIGNATURE_NAME).unlink()
    _unchanged_after_refusal(root, "is unsigned .*trust='unsigned'")
    fresh = _build(seed=5)
    loaded = load_checkpoint(root, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2], trust="unsigned")
    assert loaded["generation"] == gen.name
    with pytest.raises(ValueError, match="trust='maybe'"):
        load_checkpoint(root, model=fresh[0], optimizer=fresh[1], trust="maybe")


def test_rolling_latest_back_is_refused_unless_asked_for(tmp_path):
    root = tmp_path / "ck"
    first = _saved(root)
    old_pointer = (root / "LATEST").read_bytes()  # a valid pointer to generation 1
    model, optimizer, scheduler = _build()
    _save(root, model, optimizer, scheduler, 2).wait()
    (root / "LATEST").write_bytes(old_pointer)  # roll LATEST back to the older, validly signed generation
    _unchanged_after_refusal(root, "LATEST was rolled back")
    shutil.rmtree(root / "gen-00000002")  # even with the newer generation gone, this machine saw it
    _unchanged_after_refusal(root, "generation 2 of this checkpoint was signed or seen here")
    fresh = _build(seed=5)
    assert load_checkpoint(root, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2],
                           allow_rollback=True)["generation"] == first.name
