"""The one strict parser (contracts.bounded_json) and the converter under it: bounded first, first fault stops.

Each test is the attack of issue 24 item 5 on a contract document: before this change a 3 MB document
with 10^6 bad items took ~30 s and ~2 GB to be refused (the converter collected one exception per
item), and ``from_json(None)`` raised ``TypeError``. Memory is measured with tracemalloc (no timing
assertions; ``benchmarks/untrusted_documents.py`` measures the time).
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from mixle_parallel.contracts import (
    CertificateEnvelope,
    ContractError,
    DocumentLimitError,
    DocumentLimits,
    ParallelPlan,
    Resources,
    from_dict,
    from_json,
    json_schema,
    to_json,
)
from mixle_parallel.contracts.bounded_json import (
    CONTRACT_LIMITS,
    MAX_SIGNATURES,
    SIGNED_LIMITS,
    parse_json,
    read_limited,
)

PEAK_BOUND = 150 << 20
"""Peak Python allocation allowed while refusing a 3 MB document (before: ~2 GB)."""


def _peak(call: Callable[[], Any]) -> tuple[BaseException, int]:
    """The exception ``call`` raises and the peak traced allocation while it ran."""
    tracemalloc.start()
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - returned to the test
        caught = exc
    else:
        raise AssertionError("the document was accepted")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return caught, peak


def _resources_with(devices: list[Any]) -> str:
    return json.dumps({"kind": "Resources", "version": 1, "data": {"devices": devices}}, separators=(",", ":"))


@pytest.mark.parametrize("value", [None, 5, 2.5, [1], {"kind": "ParallelPlan"}, object()],
                         ids=["None", "int", "float", "list", "dict", "object"])
def test_from_json_of_a_wrong_input_type_is_a_contract_error(value: Any) -> None:
    with pytest.raises(ContractError, match="expected JSON text"):
        from_json(value, ParallelPlan)


def test_a_3mb_contract_document_with_a_million_bad_items_is_refused_at_the_item_limit() -> None:
    text = _resources_with([1] * 1_500_000)
    assert len(text) > 3_000_000
    exc, peak = _peak(lambda: from_json(text, Resources))
    assert isinstance(exc, DocumentLimitError)
    assert f"more than {CONTRACT_LIMITS.max_items:,} items" in str(exc)
    assert peak < PEAK_BOUND, f"peak {peak / 2**20:.0f} MiB"


def test_the_first_bad_item_stops_structuring_and_is_the_only_one_named() -> None:
    text = _resources_with([1] * 400_000)  # under every limit: the converter itself must stop at item 0
    exc, peak = _peak(lambda: from_json(text, Resources))
    assert isinstance(exc, ContractError) and exc.path == "$.data.devices[0]"
    assert "devices[1]" not in str(exc) and str(exc).count("expected a DeviceSpec object") == 1
    assert peak < PEAK_BOUND, f"peak {peak / 2**20:.0f} MiB"


def test_a_document_over_the_size_limit_is_refused_before_decoding() -> None:
    small = DocumentLimits("test document", max_bytes=100, max_items=10)
    with pytest.raises(DocumentLimitError, match=r"is 101 bytes, over the limit of 100 bytes; refused before decoding"):
        parse_json(b"[" + b" " * 99 + b"]", small)  # valid JSON, one byte too long
    with pytest.raises(DocumentLimitError, match="over the limit of 100 bytes"):
        parse_json("\u00e9" * 60, small)  # 60 characters, 120 UTF-8 bytes
    with pytest.raises(DocumentLimitError, match=r"more than 10 items"):
        parse_json("[" + ",".join("1" * 11) + "]", small)


def test_read_limited_never_reads_past_the_limit(tmp_path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b"[" + b"0," * 600_000 + b"0]")
    with pytest.raises(DocumentLimitError, match=r"is 1,200,003 bytes, over the limit of 1,048,576"):
        read_limited(path, SIGNED_LIMITS)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(OSError):
        read_limited(link, SIGNED_LIMITS, follow_symlinks=False)


@pytest.mark.parametrize("text,match", [
    ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ('{"x": NaN}', "NaN is not JSON"),
    ('[Infinity]', "Infinity is not JSON"),
    ("[" * 65 + "]" * 65, "nests deeper than 64 levels"),
    ("[" * 100_000 + "]" * 100_000, "nests deeper than 64 levels"),
    ('["\\ud800"]', r"lone surrogate"),
    ('{"\\udfff": 1}', r"object key: string holds a lone surrogate"),
    ("[" + "9" * 30 + "]", "integer beyond the bound"),
    (b'["\xff"]', "not UTF-8"),
])
def test_strict_json_faults_name_the_first_fault(text: str | bytes, match: str) -> None:
    with pytest.raises(DocumentLimitError, match=match):
        parse_json(text, SIGNED_LIMITS)


def test_contract_documents_keep_nan_for_a_skipped_steps_loss() -> None:
    assert parse_json('{"loss": NaN}', CONTRACT_LIMITS)["loss"] != 0  # NaN passes through
    with pytest.raises(DocumentLimitError, match="NaN is not JSON"):
        parse_json('{"loss": NaN}', SIGNED_LIMITS)


def test_an_envelope_with_more_signatures_than_the_limit_is_refused_before_structuring_any() -> None:
    signature = {"keyid": "ab" * 32, "sig": "AAAA"}
    data = {"payload_type": "application/vnd.in-toto+json", "payload": "e30=", "signatures": [signature] * 9}
    document = {"kind": "CertificateEnvelope", "version": 1, "data": data}
    with pytest.raises(ContractError, match=r"signatures holds 9 items, more than the limit of 8"):
        from_dict(document, CertificateEnvelope)
    bad = dict(data, signatures=[1] * 500_000)  # the count is checked before item 0 is looked at
    with pytest.raises(ContractError, match=r"holds 500000 items, more than the limit of 8"):
        from_dict({**document, "data": bad}, CertificateEnvelope)
    ok = from_dict({**document, "data": dict(data, signatures=[signature] * MAX_SIGNATURES)}, CertificateEnvelope)
    assert len(ok.signatures) == MAX_SIGNATURES
    with pytest.raises(ValueError, match="more than the limit of 8"):
        CertificateEnvelope(payload_type=data["payload_type"], payload="e30=", signatures=ok.signatures * 2)
    schema = json_schema(CertificateEnvelope)["$defs"]["CertificateEnvelope"]["properties"]["signatures"]
    assert schema["maxItems"] == MAX_SIGNATURES


def test_documents_within_the_limits_still_round_trip() -> None:
    plan = ParallelPlan(dp_shard=2, tp=2)
    assert from_json(to_json(plan), ParallelPlan) == plan
    assert from_json(to_json(plan).encode("utf-8"), ParallelPlan) == plan
