"""Torch-free checkpoint pieces: JSON codec, manifest verification, pointer, rank-local rules."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle_parallel.executors.torch.checkpoint_manifest import (
    MANIFEST_NAME,
    POINTER_NAME,
    STATE_NAME,
    CheckpointError,
    CorruptCheckpointError,
    create_generation,
    derive_seed,
    from_json_value,
    manifest_problems,
    next_generation,
    publish,
    rank_file,
    read_manifest,
    rederived_loader_state,
    resolve,
    to_json_value,
    write_json_atomic,
    write_manifest,
)

_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=8),
                  st.floats(allow_nan=False))
_value = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=6), inner, max_size=4),
        st.dictionaries(st.integers(-5, 5), inner, max_size=3),
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(_value)
def test_codec_round_trips_through_strict_json(value):
    text = json.dumps(to_json_value(value), allow_nan=False)  # standard JSON: no NaN/Infinity literals
    assert from_json_value(json.loads(text)) == value


def test_codec_tags_non_finite_floats_arrays_and_numpy_scalars():
    value = {"inf": float("inf"), "ninf": float("-inf"), "arr": np.arange(6, dtype=np.uint32).reshape(2, 3),
             "f32": np.float32(0.5), "np_bool": np.bool_(True), "user": {"__mp_type__": "mine"}}
    back = from_json_value(json.loads(json.dumps(to_json_value(value), allow_nan=False)))
    assert back["inf"] == math.inf and back["ninf"] == -math.inf
    assert back["arr"].dtype == np.uint32 and back["arr"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["f32"] == 0.5 and back["np_bool"] is True
    assert back["user"] == {"__mp_type__": "mine"}  # a user key equal to the tag is escaped
    nan = from_json_value(json.loads(json.dumps(to_json_value(float("nan")))))
    assert math.isnan(nan)


def test_codec_round_trips_python_and_numpy_rng_states():
    import random

    rng = random.Random(5)
    state = rng.getstate()
    np_state = np.random.RandomState(3).get_state()
    back = from_json_value(json.loads(json.dumps(to_json_value({"py": state, "np": np_state}))))
    assert back["py"] == state
    restored = np.random.RandomState()
    restored.set_state(back["np"])
    assert restored.random() == np.random.RandomState(3).random()


def test_codec_refuses_objects_naming_where():
    with pytest.raises(TypeError, match=r"extra\['fn'\].*never pickle"):
        to_json_value({"fn": object()}, where="extra")
    with pytest.raises(CheckpointError, match="unknown tagged value 'zzz'"):
        from_json_value({"__mp_type__": "zzz"})


def _generation(root: Path) -> Path:
    name = next_generation(root)
    gen = create_generation(root, name)
    write_json_atomic(gen / STATE_NAME, {"hello": 1})
    write_json_atomic(rank_file(gen, 0), {"rank": 0})
    (gen / "dcp" / "__0_0.distcp").write_bytes(b"tensor-bytes" * 10)
    publish(root, name, write_manifest(gen, world_size=1))
    return gen


def _verify(root: Path) -> None:
    gen, digest = resolve(root)
    problems = manifest_problems(gen, read_manifest(gen, digest))
    if problems:
        raise CorruptCheckpointError(*problems[0])


def test_generations_and_pointer(tmp_path):
    first = _generation(tmp_path)
    second = _generation(tmp_path)
    assert (first.name, second.name) == ("gen-00000001", "gen-00000002")
    assert resolve(tmp_path)[0] == second
    assert json.loads((tmp_path / POINTER_NAME).read_text())["generation"] == second.name
    _verify(tmp_path)
    assert resolve(first) == (first, None)  # a generation folder may be named directly
    create_generation(tmp_path, next_generation(tmp_path))  # an unpublished (crashed) save ...
    assert resolve(tmp_path)[0] == second  # ... is never what the pointer names
    assert next_generation(tmp_path) == "gen-00000004"
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files


@pytest.mark.parametrize("damage, culprit, message", [
    ("flip", "dcp/__0_0.distcp", "sha256 differs"),
    ("truncate", "dcp/__0_0.distcp", "bytes where the manifest records"),
    ("delete", "ranks/rank-00000.json", "missing"),
    ("stray", "dcp/__9_0.distcp", "not listed in the manifest"),
    ("no_manifest", MANIFEST_NAME, "manifest is missing"),
    ("manifest_edit", MANIFEST_NAME, "differs from the one the pointer records"),
    ("torn_pointer", "../" + POINTER_NAME, "not valid JSON"),
    ("foreign_pointer", "../" + POINTER_NAME, "not a mixle-parallel-checkpoint document"),
])
def test_damaged_checkpoints_are_refused_naming_the_file(tmp_path, damage, culprit, message):
    gen = _generation(tmp_path)
    target = (gen / culprit).resolve()
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[3] ^= 1
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-1])
    elif damage in ("delete", "no_manifest"):
        target.unlink()
    elif damage == "stray":
        target.write_bytes(b"x")
    elif damage == "manifest_edit":
        doc = json.loads(target.read_text())
        doc["world_size"] = 2
        target.write_text(json.dumps(doc))
    elif damage == "torn_pointer":
        target.write_bytes(target.read_bytes()[:20])
    elif damage == "foreign_pointer":
        target.write_text(json.dumps({"generation": gen.name}))
    with pytest.raises(CorruptCheckpointError, match=message) as info:
        _verify(tmp_path)
    assert Path(info.value.path).resolve() == target
    assert str(target) in str(info.value)


def test_missing_pointer_with_unpublished_generation_is_refused(tmp_path):
    create_generation(tmp_path, next_generation(tmp_path))
    with pytest.raises(CorruptCheckpointError, match="pointer is missing") as info:
        resolve(tmp_path)
    assert info.value.path == str(tmp_path / POINTER_NAME)
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve(tmp_path / "nowhere")


def test_manifest_shards_cover_every_file_once(tmp_path):
    gen = _generation(tmp_path)
    for name in ("a", "b", "c"):
        (gen / "dcp" / name).write_bytes(name.encode())
    manifest = read_manifest(gen, resolve(tmp_path)[1])
    unlisted = [p for s in range(3) for p in manifest_problems(gen, manifest, shard=s, shards=3)]
    assert sorted(Path(f).name for f, _ in unlisted) == ["a", "b", "c"]  # each reported once
    write_manifest(gen, world_size=1)
    manifest = read_manifest(gen, None)
    (gen / "dcp" / "b").write_bytes(b"B")
    found = [p for s in range(3) for p in manifest_problems(gen, manifest, shard=s, shards=3)]
    assert [Path(f).name for f, _ in found] == ["b"]


def test_derive_seed_and_loader_rule():
    seeds = {derive_seed("mixle-parallel/rng", 1234, 3, rank, 2) for rank in range(2)}
    assert len(seeds) == 2 and all(0 <= s < 2**63 for s in seeds)
    assert derive_seed("x", 1) == derive_seed("x", 1) != derive_seed("x", 2)
    assert rederived_loader_state([{"epoch": 1}] * 4, new_world_size=2) == {"epoch": 1}
    assert rederived_loader_state([None, None], new_world_size=1) is None
    with pytest.raises(CheckpointError, match=r"saved ranks \[1, 3\]"):
        rederived_loader_state([{"i": 0}, {"i": 1}, {"i": 0}, {"i": 2}], new_world_size=2)


def test_manifest_module_and_lazy_exports_import_no_torch():
    import subprocess

    code = ("import sys, mixle_parallel, mixle_parallel.executors as e, "
            "mixle_parallel.executors.torch.checkpoint_manifest; e.CorruptCheckpointError; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
