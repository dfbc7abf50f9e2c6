"""A ledger audit checks what it claims (issue 34 item 7).

A receipt field of the wrong type is a FAULT naming its line, not a traceback; a run's certificate is
checked: signed by a key trusted for ``certify`` and linked, or the run says ``unverified``. A run under
a hand-made unsigned certificate (dated 1999, tolerance 1e9) or one signed by an untrusted key is
reported as such. ``MIXLE_PARALLEL_HOME`` is a fresh trust store per test.
"""

from __future__ import annotations

import json

import attrs
import pytest

from mixle_parallel.contracts import AdmissionCertificate, ParallelPlan, Tolerance
from mixle_parallel.verification.attestation import read_unverified
from mixle_parallel.verification.certification import certify
from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.ledger.chain import Ledger, LedgerError
from mixle_parallel.verification.ledger.verify import main_audit, verify_ledger
from tests.verification.test_ledger_attacks import _rechain, _records
from tests.verification.vhelpers import StubExecutor, make_evidence, make_receipt

DP2 = ParallelPlan(dp_shard=2)


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    for name in ("MIXLE_PARALLEL_CERTIFICATE", "MIXLE_PARALLEL_VERIFYING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _signed(trust_store: TrustStore | None = None):
    return certify([make_evidence(DP2)], executor=StubExecutor(axes=("dp_shard",)), plan=DP2, precision="fp32",
                   store=False, trust_store=trust_store)


def _run(path, certificate) -> None:
    ledger = Ledger(path)
    ledger.run_start(plan=DP2, certificate=certificate, executor="stub")
    for step in range(3):
        ledger.receipt(make_receipt(step), rank=0)
    ledger.run_end(steps=3)


@pytest.mark.parametrize("rank", [[1], {"a": 1}, "0", True, -1])
def test_a_receipt_rank_of_the_wrong_type_is_a_fault_naming_the_line(tmp_path, capsys, rank):
    path = tmp_path / "run.jsonl"
    _run(path, "unverified")
    records = _records(path)
    records[2]["payload"]["rank"] = rank  # an attacker without a key rewrites and rehashes the chain
    path.write_text("\n".join(_rechain(records)) + "\n")
    report = verify_ledger(path, head=False)
    assert any(f.line == 3 and "rank" in f.message and "non-negative integer" in f.message for f in report.faults), \
        report.summary()
    assert main_audit([str(path), "--no-head"]) == 1  # exit 1 (a fault), not a traceback (exit 2)
    assert "FAULT" in capsys.readouterr().out
    with pytest.raises(LedgerError, match="refusing to append: line 3"):
        Ledger(path)


def test_a_run_under_a_trusted_certificate_or_unverified_audits_ok(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    _run(path, _signed())
    _run(path, "unverified")
    report = verify_ledger(path)
    assert report.ok, report.summary()
    assert report.unverified_runs == 1
    assert "1 run(s) under a certificate signed by a key trusted for certify" in report.summary()
    assert "1 run(s) unverified" in report.summary()


def test_a_run_under_a_hand_made_unsigned_certificate_is_reported(tmp_path, capsys):
    honest = read_unverified(_signed())
    forged = attrs.evolve(honest, issued_at="1999-01-01T00:00:00+00:00",
                          tolerance=Tolerance(atol=1e9, rtol=1e9, source="hand-made"))
    assert isinstance(forged, AdmissionCertificate)
    path = tmp_path / "run.jsonl"
    _run(path, forged)  # the writer takes an unsigned certificate; the audit must not vouch for it
    report = verify_ledger(path)
    assert not report.ok
    assert report.first_bad.line == 1 and "UNSIGNED certificate" in report.first_bad.message
    assert "1999" in report.first_bad.message
    assert main_audit([str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAULT" in out and "links verified" not in out


def test_a_run_under_a_certificate_of_an_untrusted_key_is_reported(tmp_path):
    other = TrustStore(tmp_path / "elsewhere")  # a key this machine never trusted
    path = tmp_path / "run.jsonl"
    _run(path, _signed(other))
    report = verify_ledger(path)
    assert not report.ok
    assert report.first_bad.line == 1 and "not signed by a key trusted for certify" in report.first_bad.message


def test_a_bare_certificate_id_is_checked_against_the_local_store(tmp_path):
    from mixle_parallel.verification.cert_store import CertificateStore

    envelope = _signed()
    link = read_unverified(envelope).certificate_id
    path = tmp_path / "run.jsonl"
    _run(path, link)  # a hand call: the library's writers embed the signed envelope
    report = verify_ledger(path)
    assert report.unchecked_runs == 1 and "NOT checked" in report.summary()
    assert any("its signature was NOT checked" in w for w in report.warnings)
    assert "1 run(s) under a certificate" not in report.summary()
    CertificateStore().add(envelope)  # the signed certificate is where the audit can find it
    report = verify_ledger(path)
    assert report.ok and report.unchecked_runs == 0 and not report.warnings
    assert "1 run(s) under a certificate signed by a key trusted for certify" in report.summary()


def test_the_embedded_envelope_is_what_the_run_links(tmp_path):
    path = tmp_path / "run.jsonl"
    _run(path, _signed())
    records = _records(path)
    other = json.loads(json.dumps(records[0]["payload"]["certificate_document"]))
    records[0]["certificate"] = "sha256:" + "1" * 64  # the link no longer names the embedded certificate
    records[0]["payload"]["certificate_document"] = other
    for record in records[1:]:
        record["certificate"] = "sha256:" + "1" * 64
    path.write_text("\n".join(_rechain(records)) + "\n")
    report = verify_ledger(path, head=False)
    assert any("differs from the run's link" in f.message for f in report.faults), report.summary()
