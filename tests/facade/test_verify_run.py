"""``mixle-parallel verify-run``: passes an untouched run folder, and REFUSES, naming the file, every forgery."""

from __future__ import annotations

import base64
import json
import shutil

import pytest
import rfc8785

from mixle_parallel.cli import main
from mixle_parallel.run_verification import verify_run
from mixle_parallel.verification.keys import TrustStore
from tests.verification.run_folder import make_run


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path / "run")


def _failed(run, capsys) -> dict:
    """Run the CLI with --json; it must exit 1; the failed checks by (check, target)."""
    assert main(["verify-run", str(run), "--json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["ok"] is False
    return {(c["check"], c["target"]): c["detail"] for c in verdict["checks"] if not c["ok"]}


def test_an_untouched_run_folder_passes_with_exit_0(run, capsys):
    assert main(["verify-run", str(run), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["ok"] and {c["check"] for c in verdict["checks"]} == {
        "certificate", "ledger", "provenance", "agreement", "files"}
    assert main(["verify-run", str(run)]) == 0
    assert "verify-run" in capsys.readouterr().out


def test_only_public_keys_are_needed(run, tmp_path, capsys, monkeypatch):
    public = tmp_path / "auditor.pub"
    shutil.copy(TrustStore().public_key_path, public)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "empty-auditor-home"))
    assert main(["verify-run", str(run), "--trusted-key", str(public)]) == 0
    assert main(["verify-run", str(run), "--json"]) == 1  # the auditor's own (empty) store trusts nobody
    assert not (tmp_path / "empty-auditor-home" / "checkpoints").exists()


def test_a_tampered_subject_file_is_refused_and_named(run, capsys):
    (run / "model" / "weights" / "layer0.bin").write_bytes(b"\x00" * 1024)
    failed = _failed(run, capsys)
    assert "model/weights/layer0.bin: its sha256 differs" in failed[("provenance", "model.intoto.json")]


def test_a_missing_file_is_refused_and_named(run, capsys):
    (run / "model" / "config.json").unlink()
    failed = _failed(run, capsys)
    assert "model/config.json: missing" in failed[("provenance", "model.intoto.json")]


def test_an_extra_file_is_refused_and_named(run, capsys):
    (run / "model" / "backdoor.bin").write_bytes(b"x")
    (run / "notes.txt").write_text("hello")
    failed = _failed(run, capsys)
    assert "model/backdoor.bin: extra" in failed[("provenance", "model.intoto.json")]
    assert "notes.txt" in failed[("files", ".")]


def test_a_statement_signed_by_an_untrusted_key_is_refused(run, tmp_path, capsys, monkeypatch):
    mallory = TrustStore(tmp_path / "mallory")
    mallory.init()
    _resign(run, mallory, lambda payload: payload)  # the same statement, signed by a key nobody trusts
    failed = _failed(run, capsys)
    assert "does not trust" in failed[("provenance", "model.intoto.json")]


def test_a_key_trusted_for_other_purposes_cannot_sign_provenance(run, capsys):
    store = TrustStore()
    store.trust(store.public_key_path.read_text(), purposes="certify,ledger,checkpoint")
    failed = _failed(run, capsys)
    assert "not to provenance" in failed[("provenance", "model.intoto.json")]


def _resign(run, store: TrustStore, change) -> None:
    """Re-sign the model's statement with ``store``'s key after ``change`` edits its payload."""
    from securesystemslib.dsse import Envelope

    document = json.loads((run / "model.intoto.json").read_text())
    payload = change(json.loads(base64.b64decode(document["payload"])))
    envelope = Envelope(rfc8785.dumps(payload), document["payloadType"], {})
    envelope.sign(store.ensure_signer())
    (run / "model.intoto.json").write_bytes(rfc8785.dumps(envelope.to_dict()))


def _byproduct(payload, name):
    return next(b for b in payload["predicate"]["runDetails"]["byproducts"] if b["name"].startswith(name))


def test_a_statement_naming_another_ledger_head_is_refused(run, capsys):
    def other_head(payload):
        _byproduct(payload, "ledger:")["annotations"]["head"] = "sha256:" + "cd" * 32
        return payload

    _resign(run, TrustStore(), other_head)
    failed = _failed(run, capsys)
    assert "names ledger head sha256:cdcdcdcd" in failed[("agreement", "model.intoto.json")]


def test_a_statement_naming_another_certificate_is_refused(run, capsys):
    def other_certificate(payload):
        cert = next(d for d in payload["predicate"]["buildDefinition"]["resolvedDependencies"]
                    if d["name"] == "certificate")
        cert["annotations"]["certificate_id"] = "sha256:" + "ef" * 32
        return payload

    _resign(run, TrustStore(), other_certificate)
    failed = _failed(run, capsys)
    assert "names certificate sha256:efefefef" in failed[("agreement", "model.intoto.json")]


def test_a_ledger_run_under_another_certificate_is_refused(run, capsys):
    """The statement and the ledger agree, but the folder's certificate is not the one they name."""
    (run / "certificate-stub.json").unlink()
    failed = _failed(run, capsys)
    assert "not in this folder" in failed[("agreement", "model.intoto.json")]


def test_a_rewritten_ledger_is_refused(run, capsys):
    lines = (run / "ledger.jsonl").read_text().splitlines(keepends=True)
    (run / "ledger.jsonl").write_text("".join(lines[:-2]))
    failed = _failed(run, capsys)
    assert ("ledger", "ledger.jsonl") in failed and ("agreement", "model.intoto.json") in failed


def test_a_missing_folder_or_key_file_is_bad_input(run, capsys):
    assert main(["verify-run", "/nonexistent/run"]) == 2
    assert main(["verify-run", str(run), "--trusted-key", "/nonexistent/key.pub"]) == 2
    assert "no public key file at '/nonexistent/key.pub'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no run folder"):
        verify_run("/nonexistent/run")


def test_a_missing_statement_leaves_its_files_uncovered_and_named(run, capsys):
    (run / "model.intoto.json").unlink()
    failed = _failed(run, capsys)
    assert "model/config.json" in failed[("files", ".")] and "model/weights/layer0.bin" in failed[("files", ".")]


def test_a_linked_file_is_never_taken_for_a_subject(run, tmp_path, capsys):
    outside = tmp_path / "outside.json"
    outside.write_text('{"layers": 1}\n')
    (run / "model" / "config.json").unlink()
    (run / "model" / "config.json").symlink_to(outside)  # same bytes, but not a file of the folder
    failed = _failed(run, capsys)
    assert "model/config.json: cannot be read as a regular file" in failed[("provenance", "model.intoto.json")]
