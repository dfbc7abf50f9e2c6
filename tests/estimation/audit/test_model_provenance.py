"""``save_model(model, path, ledger=...)``: a fitted EM model saved with its signed provenance beside it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mixle_parallel
from mixle_parallel.executors.estimation import optimize
from mixle_parallel.verification import Ledger, load_certificate, read_unverified
from mixle_parallel.verification.provenance import open_provenance, subject_problems
from tests.estimation.audit.conftest import estimator


def test_a_certified_audited_fit_saves_its_model_with_provenance(rows, mp_certificate, tmp_path):
    certificate = load_certificate(mp_certificate)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    model = optimize(rows, estimator(), backend="mp", num_workers=2, admission=certificate, audit_rate=0.05,
                     ledger=ledger, max_its=3, delta=None, seed=1, chunk_size=120)
    folder = mixle_parallel.save_model(model, tmp_path / "model", ledger=ledger.path, data=rows, run_id="fit-1")
    saved = json.loads((folder / "model.json").read_text())
    assert saved["type"] == "MixtureDistribution" and saved["digest"].startswith("sha256:")
    statement, _ = open_provenance(tmp_path / "model.intoto.json")
    assert [s["name"] for s in statement["subject"]] == ["model/model.json"]
    assert subject_problems(tmp_path / "model.intoto.json", statement) == []
    predicate = statement["predicate"]
    assert predicate["buildDefinition"]["buildType"].endswith("/em-fit/v1")
    data = predicate["buildDefinition"]["externalParameters"]["data"]
    assert data["sha256"] == __import__("hashlib").sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()
    cert = next(d for d in predicate["buildDefinition"]["resolvedDependencies"] if d["name"] == "certificate")
    assert cert["annotations"]["certificate_id"] == read_unverified(certificate).certificate_id
    audit = predicate["runDetails"]["byproducts"][1]["annotations"]
    assert audit["audited_units"] >= 1 and audit["findings"] == 0 and audit["families"] == ["em"]


def test_save_model_refuses_provenance_options_without_a_ledger(tmp_path):
    model = optimize(np.linspace(-1, 1, 50), estimator(), max_its=2, seed=0)
    with pytest.raises(ValueError, match="pass ledger="):
        mixle_parallel.save_model(model, tmp_path / "m", data=np.zeros(3))
    with pytest.raises(TypeError, match="no params"):
        mixle_parallel.save_model(object(), tmp_path / "m")
