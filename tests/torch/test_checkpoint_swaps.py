"""Attacks on checkpoints by someone with write access to the storage and no key (issue 24 items 1-3).

Each swap happens for real between the moment a file is checked and the moment it would be used:
the test wraps the step that follows the check and replaces the file on disk there.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

from mixle_parallel.executors.torch import checkpoint as ck  # noqa: E402
from mixle_parallel.executors.torch.checkpoint import load_checkpoint  # noqa: E402
from mixle_parallel.executors.torch.checkpoint_manifest import CheckpointError  # noqa: E402
from mixle_parallel.verification.keys import TrustStore  # noqa: E402
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


def _saved(root: Path, seed: int = 0, steps: int = 1) -> Path:
    model, optimizer, scheduler = _build(seed=seed)
    gen = root
    for s in range(steps):
        _step(model, optimizer, scheduler, s)
        gen = _save(root, model, optimizer, scheduler, s + 1).wait()
    return gen


def _load(root: Path, **kwargs):
    fresh = _build(seed=5)
    return fresh, load_checkpoint(root, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2], **kwargs)


def _refused(root: Path, match: str, **kwargs) -> None:
    fresh = _build(seed=5)
    before = _params(fresh[0])
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(root, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2], **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(_params(fresh[0]), before)) and not fresh[1].state


def _swap_before_dcp_load(monkeypatch, target: Path, data: bytes) -> None:
    real = ck.dcp.load

    def swapping(*args, **kwargs):
        target.write_bytes(data)  # after every hash check, before DCP reads the file
        return real(*args, **kwargs)

    monkeypatch.setattr(ck.dcp, "load", swapping)


def test_a_metadata_swapped_after_its_check_never_runs(tmp_path, monkeypatch):
    gen = _saved(tmp_path / "ck")
    marker = tmp_path / "pwned"
    _swap_before_dcp_load(monkeypatch, gen / "dcp" / ".metadata", pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata.*sha256|sha256.*\.metadata|\.metadata.*bytes"):
        _load(tmp_path / "ck")
    assert not marker.exists()


def test_a_shard_swapped_after_its_check_is_refused(tmp_path, monkeypatch):
    ours = _saved(tmp_path / "ck", seed=0)
    theirs = _saved(tmp_path / "other", seed=3, steps=2)
    shard = next((ours / "dcp").glob("*.distcp"))
    _swap_before_dcp_load(monkeypatch, shard, (theirs / "dcp" / shard.name).read_bytes())
    with pytest.raises(CheckpointError, match=r"distcp"):
        _load(tmp_path / "ck")


def test_a_state_document_swapped_after_its_check_is_refused(tmp_path, monkeypatch):
    gen = _saved(tmp_path / "ck")
    state = json.loads((gen / "state.json").read_text())
    state["session_state"]["step"] = 999
    real = ck.manifest_problems

    def swapping(*args, **kwargs):
        found = real(*args, **kwargs)
        (gen / "state.json").write_text(json.dumps(state))
        return found

    monkeypatch.setattr(ck, "manifest_problems", swapping)
    with pytest.raises(CheckpointError, match="state.json"):
        _load(tmp_path / "ck")


# ---- generations bound to their run and lineage ----------------------------------------------
def _point_at(root: Path, source_root: Path) -> None:
    for name in ("LATEST", "CURRENT"):  # the other run's valid pointer: same name, its manifest digest
        shutil.copy(source_root / name, root / name)


def test_another_runs_generation_copied_in_is_refused(tmp_path):
    root, other = tmp_path / "ck", tmp_path / "other"
    _saved(root, seed=0, steps=1)
    theirs = _saved(other, seed=3, steps=2)  # gen-00000002 of another run, same key
    shutil.copytree(theirs, root / theirs.name)
    _point_at(root, other)
    _refused(root, "run")


def test_our_generation_swapped_for_another_runs_is_refused(tmp_path):
    root, other = tmp_path / "ck", tmp_path / "other"
    ours = _saved(root, seed=0, steps=1)
    theirs = _saved(other, seed=3, steps=1)  # both are gen-00000001
    shutil.rmtree(ours)
    shutil.copytree(theirs, ours)
    shutil.copy(other / "LATEST", root / "LATEST")
    _refused(root, "run")


def test_a_symlinked_generation_is_refused(tmp_path):
    root, other = tmp_path / "ck", tmp_path / "other"
    ours = _saved(root, seed=0, steps=1)
    theirs = _saved(other, seed=3, steps=1)
    shutil.rmtree(ours)
    os.symlink(theirs, ours)
    shutil.copy(other / "LATEST", root / "LATEST")
    _refused(root, "symlink|run")


def test_a_copied_root_rolled_back_is_refused(tmp_path):
    root = tmp_path / "ck"
    _saved(root, steps=1)
    first_pointer = (root / "LATEST").read_bytes()
    _saved(root, steps=1)  # generation 2 of the same run (the save continues LATEST's run)
    copy = tmp_path / "elsewhere"
    shutil.copytree(root, copy)
    shutil.rmtree(copy / "gen-00000002")
    (copy / "LATEST").write_bytes(first_pointer)
    _refused(copy, "rolled back")


def test_a_machine_that_loaded_generation_2_refuses_generation_1(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    _saved(root, steps=1)
    first_pointer = (root / "LATEST").read_bytes()
    _saved(root, steps=1)
    signer_pem = TrustStore().public_key_path.read_text()
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "second-machine"))
    TrustStore().trust(signer_pem, label="the trainer")
    _load(root)  # the second machine loads generation 2 ...
    shutil.rmtree(root / "gen-00000002")
    (root / "LATEST").write_bytes(first_pointer)
    _refused(root, "rolled back")  # ... and then refuses generation 1


def test_a_planted_folder_never_breaks_a_later_save(tmp_path):
    root = tmp_path / "ck"
    _saved(root, steps=1)
    (root / "gen-99999999").mkdir()
    (root / "gen-00000002").mkdir()  # also the very next name
    gen = _saved(root, steps=1)
    assert gen.name not in ("gen-99999999", "gen-00000002")
    assert _load(root)[1]["generation"] == gen.name
