"""Who may vouch (issue 23 item 2): the trust store's policy and the purposes each key is trusted for.

* ``keys policy off`` refuses automatic certification with the command to run; ``trusted-keys-only``
  never creates a signing key implicitly (before: the first EM fit on a machine that trusted only its
  CI's key silently made and trusted a key of its own).
* A key trusted only for ledgers cannot admit an executor, sign a checkpoint manifest that verifies,
  and so on; entries written before scopes keep every purpose.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mixle_parallel.cli import main
from mixle_parallel.contracts import NotAdmittedError, ParallelPlan
from mixle_parallel.verification.admission import certify, require_admission
from mixle_parallel.verification.attestation import (
    CHECKPOINT_MANIFEST_PREDICATE,
    LEDGER_HEAD_PREDICATE,
    STATEMENT_TYPE,
    open_statement,
    sign_statement,
)
from mixle_parallel.verification.keys import KEY_PURPOSES, KeyPurpose, TrustStore, TrustStoreError
from mixle_parallel.verification.ledger.seal import LEDGER_HEAD_TYPE, SEAL_ROLE, check_seal, sign_head
from tests.verification.vhelpers import StubExecutor, make_evidence

PLAN = ParallelPlan(dp_shard=2, tp=2)


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path) -> Path:
    monkeypatch.delenv("MIXLE_PARALLEL_CERTIFICATE", raising=False)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def ci(tmp_path) -> TrustStore:
    """Another machine (the organisation's CI) with its own key."""
    store = TrustStore(tmp_path / "ci")
    store.init(label="CI")
    return store


def _ci_certificate(ci: TrustStore):
    return certify([make_evidence(PLAN)], executor=StubExecutor(), plan=PLAN, precision="fp32", trust_store=ci,
                   store=False)


def _auto(calls: list[int]):
    def run():
        calls.append(1)
        return certify([make_evidence(PLAN)], executor=StubExecutor(), plan=PLAN, precision="fp32", store=False)
    return run


def _write_policy(home: Path, value: str) -> None:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "policy.json").write_text(json.dumps({"certification": value}))


# ---- policy ----------------------------------------------------------------------------------------
def test_policy_defaults_to_on_and_the_command_sets_it(home, capsys):
    assert TrustStore().policy() == "on" and TrustStore().may_create_key()
    assert main(["keys", "policy", "trusted-keys-only"]) == 0
    assert json.loads((home / "policy.json").read_text()) == {"certification": "trusted-keys-only"}
    assert main(["keys", "policy"]) == 0
    assert "automatic certification: trusted-keys-only" in capsys.readouterr().out
    assert not TrustStore().may_create_key()
    with pytest.raises(SystemExit):
        main(["keys", "policy", "sometimes"])
    (home / "policy.json").write_text('{"certification": "maybe"}')
    with pytest.raises(TrustStoreError, match="maybe"):
        TrustStore().policy()


def test_policy_off_refuses_automatic_certification_with_the_command(home):
    TrustStore().init()
    _write_policy(home, "off")
    calls: list[int] = []
    with pytest.raises(NotAdmittedError) as caught:
        require_admission(StubExecutor(), PLAN, "fp32", world_size=4, auto_certify=_auto(calls),
                          certify_command="mixle-parallel certify --backend stub")
    text = str(caught.value)
    assert "automatic certification is off" in text and "run `mixle-parallel certify --backend stub`" in text
    assert calls == []  # nothing was certified
    _write_policy(home, "on")
    assert require_admission(StubExecutor(), PLAN, "fp32", world_size=4, auto_certify=_auto(calls)).certified
    assert calls == [1]


def test_trusted_keys_only_never_creates_a_key_and_admits_the_ci_certificate(home, ci):
    ours = TrustStore()
    ours.trust(str(ci.public_key_path), label="org CI")
    _write_policy(home, "trusted-keys-only")
    calls: list[int] = []
    with pytest.raises(NotAdmittedError, match="trusted-keys-only"):
        require_admission(StubExecutor(), PLAN, "fp32", world_size=4, auto_certify=_auto(calls))
    assert calls == [] and not ours.has_signing_key() and not (home / "signing-key.pem").exists()
    with pytest.raises(TrustStoreError, match="trusted-keys-only"):
        ours.ensure_signer()
    assert not (home / "signing-key.pem").exists()
    assert require_admission(StubExecutor(), PLAN, "fp32", world_size=4, certificate=_ci_certificate(ci)).certified
    ours.init()  # a key made deliberately: now this machine may certify on the spot
    assert require_admission(StubExecutor(), PLAN, "fp32", world_size=4, auto_certify=_auto(calls)).certified


def test_an_em_fit_on_a_machine_that_trusts_only_its_ci_makes_no_key(home, ci):
    from mixle_parallel.executors.estimation.admission.em_admission import admit_encoded_data

    TrustStore().trust(str(ci.public_key_path), label="org CI")
    _write_policy(home, "trusted-keys-only")
    with pytest.raises(NotAdmittedError, match="trusted-keys-only"):
        admit_encoded_data("mp", admission=None, workers=2, world_size=2)
    assert not (home / "signing-key.pem").exists()
    assert [k.keyid for k in TrustStore().keys()] == [ci.keys()[0].keyid]


# ---- scopes ----------------------------------------------------------------------------------------
def test_a_key_trusted_only_for_ledgers_cannot_admit_an_executor(ci):
    ours = TrustStore()
    entry = ours.trust(str(ci.public_key_path), label="ledger signer", purposes="ledger")
    assert entry.purposes == {KeyPurpose.LEDGER}
    with pytest.raises(NotAdmittedError) as caught:
        require_admission(StubExecutor(), PLAN, "fp32", world_size=4, certificate=_ci_certificate(ci))
    assert "check 'signature' failed" in str(caught.value) and "trusts only for ledger, not to certify" in str(
        caught.value)
    ours.trust(str(ci.public_key_path), purposes=["certify", "ledger"])  # widened on purpose
    assert require_admission(StubExecutor(), PLAN, "fp32", world_size=4, certificate=_ci_certificate(ci)).certified


def test_each_purpose_is_checked_for_its_own_documents(ci):
    ours = TrustStore()
    ours.trust(str(ci.public_key_path), purposes="certify")
    manifest = {"_type": STATEMENT_TYPE, "predicateType": CHECKPOINT_MANIFEST_PREDICATE, "subject": [],
                "predicate": {"manifest_sha256": "0" * 64, "generation": "gen-00000001"}}
    with pytest.raises(NotAdmittedError, match="not to checkpoint"):
        open_statement(sign_statement(manifest, ci.signer()), ours, predicate_type=CHECKPOINT_MANIFEST_PREDICATE)
    seal = sign_head(ci.signer(), "run.jsonl", 3, "sha256:" + "0" * 64, role=SEAL_ROLE)
    problem = check_seal(seal, 3, "sha256:" + "0" * 64, ours)
    assert problem is not None and "not to ledger" in problem
    ours.trust(str(ci.public_key_path), purposes="ledger,checkpoint")
    assert check_seal(seal, 3, "sha256:" + "0" * 64, ours) is None
    assert open_statement(sign_statement(manifest, ci.signer()), ours,
                          predicate_type=CHECKPOINT_MANIFEST_PREDICATE)[0] == manifest
    assert LEDGER_HEAD_TYPE == LEDGER_HEAD_PREDICATE


def test_the_checkpoint_manifest_type_needs_the_checkpoint_purpose():
    from mixle_parallel.executors.torch.checkpoint_trust import MANIFEST_TYPE

    assert MANIFEST_TYPE == CHECKPOINT_MANIFEST_PREDICATE


def test_entries_written_before_scopes_keep_every_purpose(home, ci):
    home.mkdir(mode=0o700)
    legacy = {"keys": [{"keyid": ci.keys()[0].keyid, "public_pem": ci.public_key_path.read_text(), "label": "CI",
                        "added_at": "2026-01-01T00:00:00+00:00", "revoked_at": None}]}
    (home / "trust.json").write_text(json.dumps(legacy))
    (entry,) = TrustStore().keys()
    assert entry.purposes == KEY_PURPOSES
    assert require_admission(StubExecutor(), PLAN, "fp32", world_size=4, certificate=_ci_certificate(ci)).certified


def test_keys_trust_for_and_list(home, ci, capsys):
    assert main(["keys", "trust", str(ci.public_key_path), "--for", "certify,checkpoint", "--label", "CI"]) == 0
    assert "for certify,checkpoint CI" in capsys.readouterr().out
    assert main(["keys", "list"]) == 0
    out = capsys.readouterr().out
    assert "certify,checkpoint" in out and "automatic certification: on" in out
    assert main(["keys", "trust", str(ci.public_key_path), "--for", "certify,backups"]) == 2
    err = capsys.readouterr().err
    assert "backups" in err and "certify" in err and "ledger" in err and "checkpoint" in err
    assert TrustStore().keys()[0].purposes == {KeyPurpose.CERTIFY, KeyPurpose.CHECKPOINT}
