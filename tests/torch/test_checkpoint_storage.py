"""What someone with write access to shared storage (and no key) can plant under a checkpoint root or in the trust
store's records, and what every reader of checkpoint state does with it (issue 34 items 1-3).

Real files throughout: ``os.mkfifo`` FIFOs, symbolic links to ``/dev/zero``, forged unsigned generations, a
rolled-back ``LATEST``, high-water records damaged every way. Each test that a regression could hang has a
``pytest.mark.timeout``, so it fails instead. Each test has a fresh trust store (``MIXLE_PARALLEL_HOME``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

from mixle_parallel.cli import main as cli_main  # noqa: E402
from mixle_parallel.dcp_checkpoint import load_training_metadata, save_training_state  # noqa: E402
from mixle_parallel.executors.torch import checkpoint_trust  # noqa: E402
from mixle_parallel.executors.torch.checkpoint import load_checkpoint  # noqa: E402
from mixle_parallel.executors.torch.checkpoint_manifest import (  # noqa: E402
    CorruptCheckpointError,
    publish,
    write_manifest,
)
from mixle_parallel.executors.torch.checkpoint_marks import DamagedRecordError  # noqa: E402
from mixle_parallel.executors.torch.checkpoint_trust import SIGNATURE_NAME, UntrustedCheckpointError  # noqa: E402
from mixle_parallel.fault_tolerant_training import ElasticTrainingJob, load_checkpoint_extra  # noqa: E402
from mixle_parallel.verification.keys import TrustStore  # noqa: E402
from tests.torch.test_checkpoint_local import _build  # noqa: E402
from tests.torch.test_elastic_job import batch_fn, make_model  # noqa: E402


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _saved(root: Path, step: int = 1) -> Path:
    model, optimizer, _ = _build()
    save_training_state(model, optimizer, str(root), step=step, extra={"owner": "us"})
    return root / json.loads((root / "LATEST").read_text())["generation"]


def _fresh_load(root: Path, **kwargs):
    model, optimizer, _ = _build(seed=5)
    return load_checkpoint(root, model=model, optimizer=optimizer, **kwargs)


def _forge_unsigned(root: Path, *, step: int = 999_999, extra: dict | None = None) -> Path:
    """What an attacker without a key does: copy the latest generation, change its state, drop the signature,
    recompute the manifest and publish it."""
    source = root / json.loads((root / "LATEST").read_text())["generation"]
    forged = root / f"gen-{int(source.name[4:]) + 1:08d}"
    shutil.copytree(source, forged)
    (forged / SIGNATURE_NAME).unlink()
    state = json.loads((forged / "state.json").read_text())
    state["session_state"]["step"] = step
    state["extra"]["user"] = extra if extra is not None else {"owner": "attacker"}
    (forged / "state.json").write_text(json.dumps(state))
    publish(root, forged.name, write_manifest(forged, world_size=1))
    return forged


def _fifo(path: Path) -> None:
    if os.path.lexists(path):
        path.unlink()
    os.mkfifo(path)


# ---- item 1: every reader of checkpoint state verifies ------------------------------------------
def test_load_training_metadata_refuses_a_forged_unsigned_generation(tmp_path):
    root = tmp_path / "ck"
    _saved(root)
    _forge_unsigned(root)
    with pytest.raises(UntrustedCheckpointError, match=r"is unsigned .*trust='unsigned'"):
        load_training_metadata(str(root))
    assert load_training_metadata(str(root), trust="unsigned")["step"] == 999_999  # the explicit opt-out
    with pytest.raises(ValueError, match="trust='maybe'"):
        load_training_metadata(str(root), trust="maybe")


def test_load_checkpoint_extra_refuses_a_forged_unsigned_generation(tmp_path):
    root = tmp_path / "ck"
    _saved(root)
    _forge_unsigned(root, extra={"owner": "attacker"})
    with pytest.raises(UntrustedCheckpointError, match="is unsigned"):
        load_checkpoint_extra(str(root))
    assert load_checkpoint_extra(str(root), trust="unsigned") == {"owner": "attacker"}


def test_metadata_readers_refuse_a_rolled_back_root(tmp_path):
    root = tmp_path / "ck"
    _saved(root, step=1)
    old_pointer = (root / "LATEST").read_bytes()
    _saved(root, step=2)
    (root / "LATEST").write_bytes(old_pointer)
    for read in (lambda **kw: load_training_metadata(str(root), **kw),
                 lambda **kw: load_checkpoint_extra(str(root), **kw)):
        with pytest.raises(UntrustedCheckpointError, match="LATEST was rolled back"):
            read()
    assert load_training_metadata(str(root), allow_rollback=True)["step"] == 1


def test_elastic_respawn_refuses_a_forged_unsigned_generation(tmp_path):
    job = ElasticTrainingJob(make_model, 2, batch_fn, str(tmp_path / "ck"), lr=0.1, step_timeout_s=30)
    try:
        job.run_step(0)
        job.checkpoint().wait(120)
        root = tmp_path / "ck"
        state = json.loads((root / json.loads((root / "LATEST").read_text())["generation"] / "state.json")
                           .read_text())
        forged_extra = json.loads(json.dumps(state["extra"]["user"]))
        forged_extra["loader_states"]["1"]["batch_idx"] = 0  # claims rank 1 is further back than it is
        _forge_unsigned(root, extra=forged_extra)
        with pytest.raises(UntrustedCheckpointError, match="is unsigned"):
            job.respawn_rank(1)
        assert job.respawn_rank(1, trust="unsigned").batch_idx == 1  # opted out: read, then checked as before
    finally:
        job.close()


# ---- item 2: storage is read safely -------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_fifo_as_the_latest_signature_is_refused_at_once(tmp_path):
    root = tmp_path / "ck"
    gen = _saved(root)
    _fifo(gen / SIGNATURE_NAME)
    with pytest.raises(UntrustedCheckpointError, match=r"MANIFEST\.sig is a FIFO"):
        _fresh_load(root)
    with pytest.raises(UntrustedCheckpointError, match=r"MANIFEST\.sig is a FIFO"):
        load_training_metadata(str(root))


@pytest.mark.timeout(60)
def test_a_fifo_as_the_previous_signature_is_refused_at_once(tmp_path):
    root = tmp_path / "ck"
    first = _saved(root, step=1)
    _saved(root, step=2)
    _fifo(first / SIGNATURE_NAME)
    with pytest.raises(UntrustedCheckpointError, match=r"previous generation .*MANIFEST\.sig is a FIFO"):
        _fresh_load(root)


@pytest.mark.timeout(60)
def test_a_fifo_or_device_link_where_latest_or_a_state_file_belongs_is_refused(tmp_path):
    root = tmp_path / "ck"
    gen = _saved(root)
    (gen / "state.json").unlink()
    (gen / "state.json").symlink_to("/dev/zero")
    with pytest.raises(CorruptCheckpointError, match=r"state\.json: a symbolic link, not a regular file"):
        load_training_metadata(str(root))
    _fifo(root / "LATEST")
    with pytest.raises(CorruptCheckpointError, match=r"LATEST: cannot be read as a regular file .*FIFO"):
        _fresh_load(root)


@pytest.mark.timeout(60)
def test_a_run_record_linked_to_dev_zero_is_refused_naming_it(tmp_path, home):
    root = tmp_path / "ck"
    _saved(root)
    run_records = sorted((home / "checkpoints").glob("run-*.json"))
    assert len(run_records) == 1
    run_records[0].unlink()
    run_records[0].symlink_to("/dev/zero")
    with pytest.raises(DamagedRecordError, match=rf"{run_records[0]} is damaged .*symbolic link.*"
                                                 rf"mixle-parallel checkpoint repair-mark {root}"):
        _fresh_load(root)


@pytest.mark.timeout(120)
def test_planted_generation_folders_cost_a_bounded_amount_of_work(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    _saved(root)
    big = tmp_path / "big.sig"
    big.write_bytes(b"{" + b" " * ((1 << 20) - 2) + b"}")  # 1 MiB; every planted signature is a link to it
    for number in range(100, 500):
        folder = root / f"gen-{number:08d}"
        folder.mkdir()
        os.link(big, folder / SIGNATURE_NAME)
    opened = []
    real = checkpoint_trust._signed
    monkeypatch.setattr(checkpoint_trust, "_signed", lambda gen, store: opened.append(gen) or real(gen, store))
    assert _fresh_load(root)["generation"] == "gen-00000001"
    assert len(opened) <= checkpoint_trust.MAX_NEWER_CANDIDATES + 1  # LATEST's own, then the nearest few


def test_a_newer_signed_generation_is_still_found_among_planted_folders(tmp_path, monkeypatch, home):
    """The bounded scan still proves a rollback to a machine that never saw the newer generation."""
    root = tmp_path / "ck"
    _saved(root, step=1)
    old_pointer = (root / "LATEST").read_bytes()
    _saved(root, step=2)
    for number in range(3, 40):  # planted junk above the real newer generation
        (root / f"gen-{number:08d}").mkdir()
        (root / f"gen-{number:08d}" / SIGNATURE_NAME).write_text("{}")
    (root / "LATEST").write_bytes(old_pointer)
    other = tmp_path / "other-machine"
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(other))
    TrustStore(other).trust(str(home / "signing-key.pub"))
    with pytest.raises(UntrustedCheckpointError, match="generation 2 of this checkpoint was signed"):
        _fresh_load(root)


# ---- item 3: a damaged high-water record fails closed -------------------------------------------
_DAMAGE = {
    "float generation": lambda doc: json.dumps({**doc, "generation": 2.0}),
    "list generation": lambda doc: json.dumps({**doc, "generation": [2]}),
    "NaN generation": lambda doc: json.dumps({**doc, "generation": float("nan")}),
    "string generation": lambda doc: json.dumps({**doc, "generation": "2"}),
    "bool generation": lambda doc: json.dumps({**doc, "generation": True}),
    "zero generation": lambda doc: json.dumps({**doc, "generation": 0}),
    "duplicate keys": lambda doc: json.dumps(doc)[:-1] + ', "generation": 1}',
    "a list": lambda doc: json.dumps([doc]),
    "not JSON": lambda doc: "{generation: 2",
    "bad digest": lambda doc: json.dumps({**doc, "manifest_sha256": 7}),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_a_damaged_high_water_record_is_an_error_naming_the_repair(tmp_path, home, damage):
    root = tmp_path / "ck"
    _saved(root, step=1)
    old_pointer = (root / "LATEST").read_bytes()
    _saved(root, step=2)
    shutil.rmtree(root / "gen-00000002")
    (root / "LATEST").write_bytes(old_pointer)  # only the record knows generation 2 was seen
    record = next((home / "checkpoints").glob("run-*.json"))
    record.write_text(_DAMAGE[damage](json.loads(record.read_text())))
    with pytest.raises(DamagedRecordError, match=rf"{record} is damaged .*`mixle-parallel checkpoint repair-mark "):
        _fresh_load(root)
    with pytest.raises(DamagedRecordError):
        load_training_metadata(str(root))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_an_unreadable_high_water_record_is_an_error(tmp_path, home, kind):
    root = tmp_path / "ck"
    _saved(root)
    record = next((home / "checkpoints").glob("run-*.json"))
    record.unlink()
    os.mkfifo(record) if kind == "fifo" else record.mkdir()
    with pytest.raises(DamagedRecordError, match=rf"{record} is damaged \(unreadable"):
        _fresh_load(root)


def test_repair_mark_rebuilds_from_the_signed_generations_and_keeps_refusing_a_rollback(tmp_path, home, capsys):
    root = tmp_path / "ck"
    _saved(root, step=1)
    old_pointer = (root / "LATEST").read_bytes()
    newer = _saved(root, step=2)
    (root / "LATEST").write_bytes(old_pointer)
    record = next((home / "checkpoints").glob("run-*.json"))
    record.write_text('{"generation": 2.0}')
    assert cli_main(["checkpoint", "repair-mark", str(root)]) == 0
    assert "rebuilt at generation 2" in capsys.readouterr().out
    assert list(record.parent.glob(record.name + ".damaged-*"))  # kept aside, not deleted
    with pytest.raises(UntrustedCheckpointError, match="LATEST was rolled back"):  # the repair is no bypass
        _fresh_load(root)
    assert newer.name == "gen-00000002"
    assert cli_main(["checkpoint", "repair-mark", str(root)]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert cli_main(["checkpoint", "repair-mark", str(tmp_path / "nowhere")]) == 2


# ---- the one strict parser for hashed checkpoint documents --------------------------------------
@pytest.mark.parametrize("text", ['{"format": 1, "format": 2}', '{"x": NaN}', "[1, 2]"])
def test_a_hashed_state_document_must_be_strict_json(tmp_path, text):
    root = tmp_path / "ck"
    gen = _saved(root)
    (gen / "state.json").write_text(text)
    publish(root, gen.name, write_manifest(gen, world_size=1))  # hashes match: only the parser can refuse
    refusal = "the global state is not valid JSON.*(duplicate key|NaN is not JSON|must be a JSON object)"
    with pytest.raises(CorruptCheckpointError, match=refusal):
        load_training_metadata(str(root), trust="unsigned")


def test_64_bit_seeds_and_big_integers_round_trip_through_the_strict_parser(tmp_path):
    """The strict parser bounds integers; a 64-bit RNG seed (an unseeded torch's) and a user's big int still load."""
    root = tmp_path / "ck"
    model, optimizer, _ = _build()
    torch.manual_seed(2**64 - 1)
    try:
        save_training_state(model, optimizer, str(root), step=3, extra={"big": 10**30, "neg": -(10**25)})
    finally:
        torch.manual_seed(0)
    assert load_training_metadata(str(root))["extra"] == {"big": 10**30, "neg": -(10**25)}
    assert _fresh_load(root)["generation"] == "gen-00000001"
