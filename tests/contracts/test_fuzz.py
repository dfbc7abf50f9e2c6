"""Fuzzing documents: 10,000 mutated contract documents per run yield only ContractError or valid contracts.

Each hypothesis example draws a valid contract (the public strategies), then applies 100 seeded
mutations to its JSON document: a node replaced by an adversarial value (4,300-digit and 2**31+1
ints, lone surrogates, 100-deep and 100,000-deep nesting, NaN, wrong types), a key dropped or
added, a duplicate key or non-UTF-8 bytes in the text. Whatever the converter accepts, the
exported JSON Schema must accept too; nothing may take long.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixle_parallel.contracts import CONTRACT_TYPES, ContractError, from_json, json_schema, to_dict, to_json
from mixle_parallel.verification.strategies import strategy_for

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the exported schema")

MUTATIONS_PER_EXAMPLE = 100
EXAMPLES = 100  # x 100 mutations = 10,000 documents
SLOWEST_S = 1.0


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


ADVERSARIAL: list[Any] = [
    None, True, 0, -1, 2**31 + 1, 2**63, 10**300, 1e308, float("nan"), float("inf"), "", "\ud800", "x\udfffy",
    "sha256:" + "AB" * 32, [], {}, [1, "a"], {"a": {"b": [None]}}, _deep(100), "é" * 1000,
]


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _set(document: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = new
    return document


def _mutated_text(document: dict[str, Any], rng: random.Random) -> str | bytes:
    doc = json.loads(json.dumps(document))
    paths = _paths(doc)
    choice = rng.randrange(6)
    if choice <= 2:
        doc = _set(doc, rng.choice(paths), rng.choice(ADVERSARIAL))
    elif choice == 3:
        containers = [p for p in paths if isinstance(_get(doc, p), dict) and _get(doc, p)]
        if containers:
            target = _get(doc, rng.choice(containers))
            if rng.random() < 0.5:
                target.pop(rng.choice(sorted(target)))
            else:
                target["unexpected"] = rng.choice(ADVERSARIAL)
    elif choice == 4:
        text = json.dumps(doc)
        if rng.random() < 0.5:
            return text[:-1] + ', "kind": "ParallelPlan"}'  # a duplicate key
        return text.replace("1", "1" + "0" * 4300, 1)  # a 4,301-digit integer somewhere
    else:
        raw = bytearray(json.dumps(doc).encode("utf-8"))
        raw[rng.randrange(len(raw))] = rng.choice([0xFF, 0xC0, 0x80, 0xED])
        return bytes(raw)
    if rng.random() < 0.02:
        return "[" * 100_000 + "]" * 100_000
    return json.dumps(doc, allow_nan=True)


def _get(document: Any, path: tuple) -> Any:
    for step in path:
        document = document[step]
    return document


KINDS = sorted(CONTRACT_TYPES.items())


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_mutated_documents_raise_only_contract_errors(data: st.DataObject, seed: int) -> None:
    name, cls = data.draw(st.sampled_from(KINDS), label="kind")
    document = to_dict(data.draw(strategy_for(cls), label=name))
    schema = json_schema(cls)
    rng = random.Random(seed)
    for _ in range(MUTATIONS_PER_EXAMPLE):
        text = _mutated_text(document, rng)
        started = time.perf_counter()
        try:
            parsed = from_json(text, cls)
        except ContractError:
            parsed = None
        took = time.perf_counter() - started
        assert took < SLOWEST_S, f"{name}: a mutated document took {took:.2f}s"
        if parsed is not None:  # whatever the converter accepts, the schema accepts
            jsonschema.validate(json.loads(to_json(parsed)), schema)
            assert to_json(from_json(to_json(parsed), cls)) == to_json(parsed)  # (NaN != NaN: compare text)


@pytest.mark.parametrize("name,cls", KINDS, ids=[k for k, _ in KINDS])
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_every_strategy_example_validates_against_the_schema(name: str, cls: type, data: st.DataObject) -> None:
    jsonschema.validate(json.loads(to_json(data.draw(strategy_for(cls)))), json_schema(cls))


def test_huge_plan_sizes_and_integers_are_refused_quickly() -> None:
    from mixle_parallel.contracts import ParallelPlan

    started = time.perf_counter()
    with pytest.raises(ValueError, match="must divide"):
        ParallelPlan(dp_shard=10**9 + 1, ep=2)
    assert time.perf_counter() - started < 0.5
    with pytest.raises(ValueError, match="2\\*\\*31"):
        ParallelPlan(tp=2**31 + 1)
    document = to_dict(ParallelPlan(tp=2))
    document["data"]["tp"] = 10**4300 if sys.get_int_max_str_digits() == 0 else 10**400
    with pytest.raises(ContractError, match=r"\$\.data\.tp: integer beyond the bound"):
        from_json(json.dumps(document), ParallelPlan)
