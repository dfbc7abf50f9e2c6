"""Provenance statements: what they bind, that standard tools read them, and that their checks refuse."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.provenance import (
    ProvenanceError,
    open_provenance,
    provenance_statement,
    subject_problems,
)
from tests.verification.run_folder import DATA, make_run


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


def _public_key() -> SSlibKey:
    """The public key file the trust store hands out, read with cryptography and securesystemslib only."""
    pem = (Path(os.environ["MIXLE_PARALLEL_HOME"]) / "signing-key.pub").read_bytes()
    return SSlibKey.from_crypto(load_pem_public_key(pem))


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path / "run")


def test_a_statement_binds_files_run_certificate_ledger_head_data_and_audits(run):
    statement, keyid = open_provenance(run / "model.intoto.json")
    assert keyid == TrustStore().lookup(keyid).keyid
    assert [s["name"] for s in statement["subject"]] == ["model/config.json", "model/weights/layer0.bin"]
    predicate = statement["predicate"]
    external = predicate["buildDefinition"]["externalParameters"]
    assert external["run_id"] == "run-0001" and external["plan"]["dp_shard"] == 2 and external["precision"] == "fp32"
    assert external["data"]["kind"] == "array" and external["data"]["shape"] == [64]
    names = [d["name"] for d in predicate["buildDefinition"]["resolvedDependencies"]]
    assert names[0].startswith("executor:stub@") and names[1] == "certificate" and names[2] == "data:array"
    ledger, audit = predicate["runDetails"]["byproducts"]
    lines = (run / "ledger.jsonl").read_text().splitlines()
    assert ledger["annotations"]["entries"] == len(lines)
    assert ledger["annotations"]["head"] == json.loads(lines[-1])["hash"]
    assert ledger["annotations"]["certificate"] == json.loads(lines[0])["certificate"]
    assert audit["annotations"]["findings_by_cause"] == {"device": 1}
    assert audit["annotations"]["audited_steps"] == 3 and audit["annotations"]["findings"] == 1


def test_standard_tools_read_the_statement_and_verify_its_envelope(run):
    """in-toto-attestation's own bindings parse the statement and its SLSA predicate; securesystemslib verifies
    the DSSE envelope with the public key file: none of this library's code is in the loop."""
    document = json.loads((run / "model.intoto.json").read_text())
    envelope = Envelope.from_dict(document)
    key = _public_key()
    assert key.keyid in envelope.verify([key], 1)
    payload = json.loads(base64.b64decode(document["payload"]))
    proto = Statement.copy_from_pb(json_format.ParseDict(payload, Statement([], "", {}).pb))
    proto.validate()
    assert proto.pb.predicate_type == "https://slsa.dev/provenance/v1" and len(proto.pb.subject) == 2
    slsa = json_format.ParseDict(payload["predicate"], provenance_pb2.Provenance())  # strict: unknown fields fail
    assert slsa.build_definition.build_type.endswith("/training-run/v1")
    assert slsa.run_details.metadata.invocation_id == "run-0001"


def test_a_forged_payload_fails_the_standard_verifier_too(run):
    document = json.loads((run / "model.intoto.json").read_text())
    payload = json.loads(base64.b64decode(document["payload"]))
    payload["predicate"]["runDetails"]["byproducts"][1]["annotations"]["findings"] = 0
    document["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    key = _public_key()
    with pytest.raises(Exception, match="do not match threshold"):
        Envelope.from_dict(json.loads(json.dumps(document))).verify([key], 1)  # from_dict pops its input
    (run / "model.intoto.json").write_text(json.dumps(document))
    with pytest.raises(ProvenanceError, match="does not verify"):
        open_provenance(run / "model.intoto.json")


def test_subject_checks_name_a_tampered_a_missing_and_an_extra_file(run):
    statement, _ = open_provenance(run / "model.intoto.json")
    assert subject_problems(run / "model.intoto.json", statement) == []
    (run / "model" / "config.json").write_text('{"layers": 2}\n')
    (run / "model" / "weights" / "layer0.bin").unlink()
    (run / "model" / "extra.bin").write_bytes(b"x")
    problems = dict(subject_problems(run / "model.intoto.json", statement))
    assert "tampered" in problems[str(run / "model" / "config.json")]
    assert "missing" in problems[str(run / "model" / "weights" / "layer0.bin")]
    assert "extra" in problems[str(run / "model" / "extra.bin")]


def test_a_key_not_trusted_for_provenance_is_refused(run):
    store = TrustStore()
    keyid = store.keys()[0].keyid
    store.trust(store.public_key_path.read_text(), purposes="certify,ledger,checkpoint")
    with pytest.raises(ProvenanceError, match="not to provenance"):
        open_provenance(run / "model.intoto.json")
    assert store.lookup(keyid) is not None


def test_a_statement_refuses_a_linked_artefact_and_an_unknown_kind(run, tmp_path):
    (tmp_path / "link").symlink_to(run / "model")
    with pytest.raises(ProvenanceError, match="link"):
        provenance_statement(tmp_path / "link", ledger=run / "ledger.jsonl", kind="em", data=DATA)
    with pytest.raises(ProvenanceError, match="kind="):
        provenance_statement(run / "model", ledger=run / "ledger.jsonl", kind="inference")


def test_data_identity_digests_files_and_arrays_and_describes_the_rest(tmp_path):
    import hashlib

    import numpy as np

    from mixle_parallel.executors.estimation import files
    from mixle_parallel.verification.provenance import data_identity

    table = tmp_path / "table"
    table.mkdir()
    np.save(table / "a.npy", np.arange(6.0))
    digest = hashlib.sha256((table / "a.npy").read_bytes()).hexdigest()
    for source in (table / "a.npy", str(table), [table], files(str(table / "a.npy"))):
        identity = data_identity(source)
        assert identity["kind"] == "files" and [f["sha256"] for f in identity["files"]] == [digest], source
    array = np.arange(6.0).reshape(2, 3)
    assert data_identity(array) == {"kind": "array", "dtype": "<f8", "shape": [2, 3],
                                    "sha256": hashlib.sha256(array.tobytes()).hexdigest()}
    assert data_identity({"kind": "files", "source": "s3://bucket"}) == {"kind": "described", "source": "s3://bucket"}

    class Rdd:  # what a Spark RDD offers: its lineage
        def toDebugString(self) -> bytes:
            return b"(2) ParallelCollectionRDD[0]"

    assert data_identity(Rdd()) == {"kind": "collection", "type": "Rdd", "lineage": "(2) ParallelCollectionRDD[0]"}
