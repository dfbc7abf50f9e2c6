"""The admission gate of encoded_data / optimize: automatic by default, explicit certificates checked first.

On a fresh ``MIXLE_PARALLEL_HOME`` a multi-worker mp fit certifies EM on mp once (the harness,
about a second), stores the signed certificate and runs under it; refusals come before workers.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from mixle_parallel.contracts import NotAdmittedError
from mixle_parallel.executors.estimation import EncodedDataControlConflictError, encoded_data, fit, optimize
from mixle_parallel.verification import (
    CertificateStore,
    Ledger,
    load_certificate,
    read_ledger,
    read_unverified,
    verify_ledger,
)
from mixle_parallel.verification.admission import CERTIFICATE_ENV
from mixle_parallel.verification.capability import harness_admitted
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator


def test_plain_mixle_call_certifies_once_on_a_fresh_machine(rows, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "fresh-home"))
    model = optimize(rows, estimator(), max_its=2, backend="mp", num_workers=2)  # as in mixle: no admission=
    assert len(model.components) == 3
    assert capfd.readouterr().err.count("certifying em_mp") == 1
    (stored,) = CertificateStore().entries()
    assert (tmp_path / "fresh-home" / "signing-key.pem").stat().st_mode & 0o777 == 0o600
    ledger = Ledger(tmp_path / "auto.jsonl")
    again = fit(rows, estimator(), max_its=2, delta=None, seed=3, chunk_size=ROWS_PER_CHUNK, backend="processes",
                num_workers=3, ledger=ledger)  # another worker count, an alias: the stored certificate fits
    assert "certifying" not in capfd.readouterr().err
    assert (again.admission, again.certificate) == ("certified", stored[1].certificate_id)
    entries = read_ledger(ledger.path).entries
    assert {e.certificate for e in entries} == {stored[1].certificate_id}
    assert entries[0].payload["certificate_document"]["kind"] == "CertificateEnvelope"
    assert verify_ledger(ledger.path).ok


def test_mpi_without_a_certificate_is_refused_naming_the_command(monkeypatch, tmp_path):
    from mixle_parallel.executors.estimation.admission.em_admission import admit_encoded_data

    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "fresh-home"))
    with pytest.raises(NotAdmittedError) as info:
        admit_encoded_data("mpi", admission=None, workers=2, world_size=2)
    message = str(info.value)
    assert "no trusted certificate" in message and "fits em_mpi" in message
    assert "`mixle-parallel certify --backend mpi --plan dp_replicate=2 --workload gaussian_mixture" in message


def test_certificate_from_certify_admits_mp_with_two_and_three_workers(rows, mp_certificate, tmp_path):
    plain = fit(rows, estimator(), max_its=3, delta=None, seed=2, chunk_size=ROWS_PER_CHUNK)
    ledger = Ledger(tmp_path / "run.jsonl")
    by_path = fit(rows, estimator(), max_its=3, delta=None, seed=2, chunk_size=ROWS_PER_CHUNK, backend="mp",
                  num_workers=2, admission=str(mp_certificate), ledger=ledger)
    envelope = load_certificate(mp_certificate)
    cert = read_unverified(envelope)
    by_object = fit(rows, estimator(), max_its=3, delta=None, seed=2, chunk_size=ROWS_PER_CHUNK, backend="mp",
                    num_workers=3, admission=envelope)
    for result in (by_path, by_object):
        assert (result.admission, result.certificate) == ("certified", cert.certificate_id)
        assert result.history == plain.history
    report = verify_ledger(ledger.path)
    assert report.ok, report.summary()
    entries = read_ledger(ledger.path).entries
    assert entries[0].kind == "run_start" and entries[0].payload["certificate_document"] is not None
    assert {e.certificate for e in entries} == {cert.certificate_id}
    receipts = [e for e in entries if e.kind == "receipt"]
    assert len(receipts) == 3 and all(
        e.payload["receipt"]["data"]["extra"]["admission"] == "certified" for e in receipts
    )


def test_a_certificate_for_another_backend_is_refused_before_any_worker_starts(rows, mp_certificate):
    before = set(multiprocessing.active_children())
    with pytest.raises(NotAdmittedError) as info:
        encoded_data(rows, estimator=estimator(), backend="dask", num_workers=2, admission=mp_certificate)
    message = str(info.value)
    assert "check 'executor' failed: certificate is for executor 'em_mp', not 'em_dask'" in message
    assert "check 'comm_backend' failed" in message and "admission='unverified'" in message
    assert set(multiprocessing.active_children()) == before  # no worker process was started


def test_unverified_runs_and_says_so_everywhere(rows, tmp_path):
    ledger = Ledger(tmp_path / "unverified.jsonl")
    result = fit(
        rows,
        estimator(),
        max_its=2,
        delta=None,
        seed=1,
        chunk_size=ROWS_PER_CHUNK,
        backend="mp",
        num_workers=2,
        admission="unverified",
        ledger=ledger,
    )
    assert (result.admission, result.certificate) == ("unverified", "unverified")
    entries = read_ledger(ledger.path).entries
    assert all(e.certificate == "unverified" for e in entries)
    assert all(
        e.payload["receipt"]["data"]["extra"]["admission"] == "unverified" for e in entries if e.kind == "receipt"
    )
    assert verify_ledger(ledger.path).ok


def test_one_process_needs_no_certificate_and_ignores_the_mesh_certificate_env(rows, monkeypatch, tmp_path):
    monkeypatch.setenv(CERTIFICATE_ENV, str(tmp_path / "not-there.json"))
    threads = fit(
        rows, estimator(), max_its=2, delta=None, seed=1, chunk_size=ROWS_PER_CHUNK, backend="local", num_workers=3
    )  # threads in this process: world size 1
    assert threads.admission == "local"
    one = fit(rows, estimator(), max_its=2, delta=None, seed=1, chunk_size=ROWS_PER_CHUNK, backend="mp", num_workers=1)
    assert one.admission == "local" and one.history == threads.history


def test_an_explicit_certificate_is_checked_even_without_a_mesh(rows, mp_certificate):
    with pytest.raises(NotAdmittedError, match="not 'em_local'"):
        encoded_data(rows, estimator=estimator(), backend="local", admission=mp_certificate)


def test_the_harness_runs_under_its_capability(rows):
    from mixle_parallel.verification.harness import worker

    with harness_admitted(worker._HARNESS):
        result = fit(rows[:600], estimator(), max_its=1, chunk_size=ROWS_PER_CHUNK, backend="mp", num_workers=2)
    assert result.admission == "verifying"


def test_verification_controls_conflict_with_an_existing_handle(rows, tmp_path):
    with encoded_data(rows, estimator=estimator(), num_chunks=4) as handle:
        for control in ({"admission": "unverified"}, {"audit_rate": 0.5}, {"ledger": tmp_path / "x.jsonl"}):
            with pytest.raises(EncodedDataControlConflictError, match=next(iter(control))):
                optimize(handle, estimator(), max_its=1, **control)


def test_bad_admission_value_is_named(rows):
    with pytest.raises(ValueError, match="admission=3"):
        encoded_data(rows, estimator=estimator(), backend="mp", num_workers=2, admission=3)
    with pytest.raises(FileNotFoundError, match="mixle-parallel certify"):
        encoded_data(rows, estimator=estimator(), backend="mp", num_workers=2, admission="missing/cert.json")
    assert np.isfinite(rows).all()


def test_mpi_inside_mpiexec_certifies_in_situ_instead_of_refusing(monkeypatch, tmp_path):
    # the launched form (issue 23 item 1) hands the gate an in-situ certifier; outside a launcher it stays refused
    from mixle_parallel.executors.estimation.admission.em_in_situ import in_situ_certifier

    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert in_situ_certifier("mpi", 2) is None
    monkeypatch.setenv("PMI_RANK", "0")
    assert callable(in_situ_certifier("mpi", 2))
    assert in_situ_certifier("mpi", 1) is None and in_situ_certifier("mp", 2) is None
