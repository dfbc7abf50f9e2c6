"""Untrusted signed documents fail fast (issue 24 item 5, issue 23 item 8): one test per document kind.

A certificate file, a DSSE envelope's payload, a ledger seal, a ledger head file and a checkpoint
manifest signature, each 3 MB with 10^6 bad items (a million ``1``s where signatures belong), are
refused with a message naming the limit, at a bounded peak allocation (tracemalloc; before this change
each took 23-45 s and ~2 GB). A signed payload with duplicate keys is refused even under a valid
signature. Timing is measured by ``benchmarks/untrusted_documents.py``, never asserted here.
"""

from __future__ import annotations

import base64
import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from securesystemslib.dsse import Envelope

from mixle_parallel.contracts import (
    IN_TOTO_PAYLOAD_TYPE,
    CertificateEnvelope,
    EnvelopeSignature,
    NotAdmittedError,
    ParallelPlan,
)
from mixle_parallel.contracts.bounded_json import MANIFEST_LIMITS
from mixle_parallel.verification.admission import require_admission
from mixle_parallel.verification.attestation import (
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    load_certificate,
    open_envelope,
    open_statement,
)
from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.ledger.seal import check_seal, read_head
from tests.verification.vhelpers import StubExecutor

PEAK_BOUND = 150 << 20
"""Peak traced allocation allowed while refusing one 3 MB document."""

MILLION_BAD = 1_500_000
"""Bad items in a document (``1,`` each): 3 MB of text."""


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path) -> Path:
    """A fresh trust store per test, with this machine's key."""
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MIXLE_PARALLEL_CERTIFICATE", raising=False)
    TrustStore().init()
    return tmp_path / "home"


def _bad_envelope() -> dict[str, Any]:
    """A CertificateEnvelope document of 3 MB whose signatures are a million integers."""
    data = {"payload_type": IN_TOTO_PAYLOAD_TYPE, "payload": "e30=", "signatures": [1] * MILLION_BAD}
    return {"kind": "CertificateEnvelope", "version": 1, "data": data}


def _write_bad(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_bad_envelope(), separators=(",", ":")))
    assert path.stat().st_size > 3_000_000
    return path


def _refused(call: Callable[[], Any]) -> tuple[str, int]:
    """The refusal's text (an exception's, or a returned problem string) and the peak traced allocation."""
    tracemalloc.start()
    try:
        try:
            text = call()
        except Exception as exc:  # noqa: BLE001 - the refusal is the point
            text = str(exc)
        else:
            assert isinstance(text, str), f"accepted: {text!r}"
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return text, peak


def test_a_3mb_certificate_file_is_refused_before_decoding(tmp_path):
    path = _write_bad(tmp_path / "cert.json")
    text, peak = _refused(lambda: load_certificate(path))
    assert "check 'certificate' failed" in text and "over the limit of 1,048,576 bytes; refused before decoding" in text
    assert peak < PEAK_BOUND
    with pytest.raises(NotAdmittedError, match="refused before decoding"):  # the gate reads it the same way
        require_admission(StubExecutor(), ParallelPlan(dp_shard=2), "fp32", certificate=path, world_size=2)


def test_an_envelope_payload_over_the_limit_is_refused_before_base64_decoding():
    signature = EnvelopeSignature(keyid="ab" * 32, sig="AAAA")
    huge = CertificateEnvelope(IN_TOTO_PAYLOAD_TYPE, "QUFB" * 1_000_000, (signature,))  # 4 MB of base64
    text, peak = _refused(lambda: open_envelope(huge))
    assert "check 'certificate' failed" in text and "base64 characters, over the limit" in text
    assert peak < PEAK_BOUND


def test_a_signed_payload_with_duplicate_keys_is_refused_under_a_valid_signature():
    statement = json.dumps({"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE, "subject": [],
                            "predicate": {}})
    payload = statement[:-1] + f', "predicateType": "{PREDICATE_TYPE}"}}'  # the same key twice
    envelope = Envelope(payload.encode(), IN_TOTO_PAYLOAD_TYPE, {})
    envelope.sign(TrustStore().signer())
    document = envelope.to_dict()
    signed = CertificateEnvelope(document["payloadType"], document["payload"],
                                 tuple(EnvelopeSignature(s["keyid"], s["sig"]) for s in document["signatures"]))
    with pytest.raises(NotAdmittedError, match="duplicate key 'predicateType'"):
        open_statement(signed)


def test_a_3mb_ledger_seal_is_refused_at_the_item_limit():
    text, peak = _refused(lambda: check_seal(_bad_envelope(), 3, "sha256:" + "0" * 64, TrustStore()))
    assert text.startswith("run_end seal does not verify") and "more than 100,000 items" in text
    assert peak < PEAK_BOUND
    nine = _bad_envelope()
    nine["data"]["signatures"] = [{"keyid": "ab" * 32, "sig": "AAAA"}] * 9
    problem = check_seal(nine, 3, "sha256:" + "0" * 64, TrustStore())
    assert problem is not None and "signatures holds 9 items, more than the limit of 8" in problem


def test_a_3mb_ledger_head_file_is_refused_before_decoding(tmp_path):
    path = _write_bad(tmp_path / "run.jsonl.head")
    text, peak = _refused(lambda: read_head(path, TrustStore()))
    assert f"signed head {path}" in text and "over the limit of 1,048,576 bytes; refused before decoding" in text
    assert peak < PEAK_BOUND


def test_a_3mb_checkpoint_manifest_signature_is_refused(tmp_path):
    from mixle_parallel.executors.torch.checkpoint_trust import UntrustedCheckpointError, verify_generation

    generation = tmp_path / "ckpt" / "gen-00000001"
    generation.mkdir(parents=True)
    (generation / "MANIFEST.json").write_text("{}")
    _write_bad(generation / "MANIFEST.sig")
    text, peak = _refused(lambda: verify_generation(generation))
    assert "MANIFEST.sig is not a manifest signature" in text and "refused before decoding" in text
    assert peak < PEAK_BOUND
    with pytest.raises(UntrustedCheckpointError):
        verify_generation(generation)


def test_a_well_formed_envelope_still_opens():
    from mixle_parallel.verification.attestation import sign_statement

    document = {"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE, "subject": [], "predicate": {"a": 1}}
    statement, keyid = open_statement(sign_statement(document, TrustStore().signer()))
    assert statement == document and keyid == TrustStore().keys()[0].keyid
    assert base64.b64decode(sign_statement(document, TrustStore().signer()).payload)


def test_a_ledger_line_with_a_duplicate_key_is_not_an_entry(tmp_path):
    from mixle_parallel.verification.ledger.chain import read_ledger

    path = tmp_path / "run.jsonl"
    path.write_text('{"seq": 0, "seq": 1}\n')
    result = read_ledger(path)
    assert not result.entries and "duplicate key 'seq'" in result.problems[0][1]


def test_a_checkpoint_manifest_with_a_duplicate_key_is_refused(tmp_path):
    from mixle_parallel.executors.torch.checkpoint_manifest import CorruptCheckpointError, read_manifest

    generation = tmp_path / "gen-00000001"
    generation.mkdir()
    (generation / "MANIFEST.json").write_text('{"format": "mixle-parallel-checkpoint", "format": "other"}')
    with pytest.raises(CorruptCheckpointError, match="duplicate key 'format'"):
        read_manifest(generation, None)
    (generation / "MANIFEST.json").write_text(" " * (MANIFEST_LIMITS.max_bytes + 1))
    with pytest.raises(CorruptCheckpointError, match="refused before decoding"):
        read_manifest(generation, None)
