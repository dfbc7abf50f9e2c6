"""The one converter: round trips, strict envelopes, mutated documents rejected with the field path."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixle_parallel.contracts import (
    CONTRACT_TYPES,
    SCHEMA_VERSION,
    ContractError,
    ParallelPlan,
    Resources,
    StepReceipt,
    canonical_json,
    from_dict,
    from_json,
    json_schema,
    to_dict,
    to_json,
)
from mixle_parallel.verification.strategies import STRATEGIES, strategy_for

KINDS = sorted(CONTRACT_TYPES.items())


def test_every_contract_has_a_strategy() -> None:
    assert set(CONTRACT_TYPES.values()) <= set(STRATEGIES)


@pytest.mark.parametrize("name,cls", KINDS, ids=[k for k, _ in KINDS])
@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_json_round_trip_equals_original(name: str, cls: type, data: st.DataObject) -> None:
    obj = data.draw(strategy_for(cls))
    text = to_json(obj)
    again = from_json(text, cls)
    assert again == obj
    assert canonical_json(again) == canonical_json(obj)
    assert json.loads(text)["kind"] == name and json.loads(text)["version"] == SCHEMA_VERSION


def _retyped(value: Any) -> Any:
    """A JSON value of a different type than ``value``."""
    if isinstance(value, dict):
        return []
    if isinstance(value, list):
        return "not-a-list"
    if isinstance(value, str):
        return 7
    if value is None:
        return []
    return "not-a-number"


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every object key (nested objects included; into lists too)."""
    out = []
    if isinstance(data, dict):
        for key, value in data.items():
            out.append(prefix + (key,))
            out.extend(_paths(value, prefix + (key,)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out.extend(_paths(value, prefix + (i,)))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    node = doc
    for step in path[:-1]:
        node = node[step]
    return node


@pytest.mark.parametrize("name,cls", KINDS, ids=[k for k, _ in KINDS])
@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_documents_are_rejected(name: str, cls: type, data: st.DataObject) -> None:
    obj = data.draw(strategy_for(cls))
    base = to_dict(obj)
    paths = [p for p in _paths(base["data"]) if not _is_free_form(cls, p)]
    if not paths:
        return
    path = data.draw(st.sampled_from(paths))
    mutation = data.draw(st.sampled_from(["drop", "add", "retype"]))
    doc = json.loads(json.dumps(base))
    parent = _parent(doc["data"], path)
    if mutation == "drop":
        del parent[path[-1]]
    elif mutation == "add":
        parent["unexpected_field"] = 1
    else:
        parent[path[-1]] = _retyped(parent[path[-1]])
    with pytest.raises(ContractError) as info:
        from_dict(doc, cls)
    assert info.value.path is not None and info.value.path.startswith("$.data")


def _is_free_form(cls: type, path: tuple[Any, ...]) -> bool:
    """Keys inside free-form JSON maps (receipt extras, library versions) are data, not schema."""
    free = {"extra", "optimizer_receipt", "library_versions"}
    return any(step in free for step in path[:-1])


def test_errors_name_the_field_path() -> None:
    doc = to_dict(ParallelPlan(tp=2))
    doc["data"]["tp"] = "2"
    with pytest.raises(ContractError, match=r"\$\.data\.tp") as info:
        from_dict(doc, ParallelPlan)
    assert info.value.path == "$.data.tp"
    doc = to_dict(Resources.single_cpu())
    doc["data"]["devices"][0]["throughput"] = "fast"
    with pytest.raises(ContractError, match=r"\$\.data\.devices\[0\]\.throughput"):
        from_dict(doc, Resources)
    doc = to_dict(ParallelPlan())
    del doc["data"]["microbatches"]
    with pytest.raises(ContractError, match=r"required field missing @ \$\.data\.microbatches"):
        from_dict(doc, ParallelPlan)


def test_rule_violations_in_documents_carry_the_rule_message() -> None:
    doc = to_dict(ParallelPlan(dp_shard=4))
    doc["data"]["ep"] = 3
    with pytest.raises(ContractError, match="ep=3 must divide"):
        from_dict(doc, ParallelPlan)


@pytest.mark.parametrize("envelope,match", [
    ({"kind": "ParallelPlan", "version": SCHEMA_VERSION}, "missing"),
    ({"kind": "ParallelPlan", "version": SCHEMA_VERSION, "data": {}, "extra": 1}, "unknown"),
    ({"kind": "StepReceipt", "version": SCHEMA_VERSION, "data": {}}, "expected a ParallelPlan"),
    ({"kind": "ParallelPlan", "version": 99, "data": {}}, "version 99 is not supported"),
    ({"kind": "ParallelPlan", "version": True, "data": {}}, "not supported"),
    ([], "an object"),
])
def test_envelope_is_strict(envelope: Any, match: str) -> None:
    with pytest.raises(ContractError, match=match):
        from_dict(envelope, ParallelPlan)


def test_invalid_json_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match="not valid JSON"):
        from_json("{", ParallelPlan)


def test_enums_serialize_by_value_and_sets_sorted() -> None:
    from mixle_parallel.contracts import BackendCapabilities

    data = to_dict(BackendCapabilities("b", {"tp", "dp_shard", "cp"}))["data"]
    assert data["axes"] == ["cp", "dp_shard", "tp"]
    assert data["precisions"] == ["bf16", "fp32"]


def test_unregistered_types_are_refused() -> None:
    with pytest.raises(TypeError, match="not a registered contract"):
        to_json({"tp": 2})


def test_no_pickle_in_the_contracts_package() -> None:
    import pathlib

    import mixle_parallel.contracts as contracts

    root = pathlib.Path(contracts.__file__).parent
    for path in root.glob("*.py"):
        assert "import pickle" not in path.read_text(), path
    assert "pickle" not in to_json(StepReceipt(1, 0.1, 1, 1, 1, 1, 1, "SGD", "fp32"))
    assert pickle  # the test itself may use pickle; the library does not


@pytest.mark.parametrize("name,cls", KINDS, ids=[k for k, _ in KINDS])
def test_json_schema_covers_every_field(name: str, cls: type) -> None:
    import attrs

    schema = json_schema(cls)
    assert schema["properties"]["kind"] == {"const": name}
    body = schema["$defs"][name]
    assert set(body["properties"]) == {f.name for f in attrs.fields(cls)}
    assert body["additionalProperties"] is False
    json.dumps(schema)


def test_json_schema_accepts_documents_when_jsonschema_is_installed() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is an optional validator")
    doc = to_dict(ParallelPlan(tp=2))
    jsonschema.validate(doc, json_schema(ParallelPlan))
    doc["data"]["tp"] = "2"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, json_schema(ParallelPlan))
