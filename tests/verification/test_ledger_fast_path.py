"""The audit's fast paths refuse everything the strict parser refuses (issue 24 item 4: audit speed).

Receipt lines are read by one compiled pattern (``receipt_line``), other canonical lines by one decode and
re-encode (``parse_canonical``); everything else goes to ``parse_json``. Each test puts one fault into a
line that looks like what the fast path takes and checks the audit still names it; the differential tests
check the fast paths return exactly what ``json.loads`` / ``receipt_from_document`` give.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.ledger_audit import build_ledger
from mixle_parallel.contracts import ContractError, FrozenDict
from mixle_parallel.contracts.bounded_json import (
    LEDGER_LINE_LIMITS,
    DocumentLimitError,
    DocumentLimits,
    parse_canonical,
    parse_json,
)
from mixle_parallel.contracts.canonical_json import hashed_json_bytes as _canonical
from mixle_parallel.contracts.receipts import receipt_facts, receipt_from_document
from mixle_parallel.verification.ledger.entries import entry_hash, iter_ledger
from mixle_parallel.verification.ledger.receipt_line import RECEIPT_LINE, match_receipt, scan_receipt
from mixle_parallel.verification.ledger.verify import verify_ledger


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


@pytest.fixture
def ledger(tmp_path) -> Path:
    path = tmp_path / "ledger.jsonl"
    build_ledger(path, 40, runs=2)
    return path


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _receipt_index(path: Path) -> int:
    return next(i for i, line in enumerate(_lines(path)) if '"kind":"receipt"' in line and i > 3)


def _edit(path: Path, index: int, old: str, new: str) -> None:
    lines = _lines(path)
    assert old in lines[index], (old, lines[index])
    lines[index] = lines[index].replace(old, new, 1)
    path.write_text("\n".join(lines) + "\n")


def _rehashed(path: Path, index: int, change) -> None:
    """Change one entry's record and recompute its hash (the chain after it then breaks, its own hash holds)."""
    lines = _lines(path)
    record = json.loads(lines[index])
    change(record)
    body = {k: v for k, v in record.items() if k != "hash"}
    lines[index] = json.dumps({**body, "hash": entry_hash(body)}, sort_keys=True, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")


def _faults_at(path: Path, index: int) -> str:
    report = verify_ledger(path)
    assert not report.ok
    return " | ".join(f.message for f in report.faults if f.line == index + 1)


def test_the_benchmark_ledger_passes_and_its_receipts_take_the_pattern(ledger):
    assert RECEIPT_LINE is not None, "StepReceipt gained a field: teach receipt_line its token"
    assert verify_ledger(ledger).ok
    receipts = [line for line in ledger.read_bytes().splitlines(keepends=True) if b'"kind":"receipt"' in line]
    assert receipts and all(match_receipt(line) is not None for line in receipts)


@pytest.mark.parametrize("old,new,expected", [
    ('"step":', '"step":7,"step":', "duplicate key"),  # a repeated key in the payload
    ('"loss":', '"loss":NaN,"x":', "NaN"),
    ('"local_tokens":64', '"local_tokens":99999999999999999999', "2**63-1"),
    ('"optimizer":"sgd"', '"optimizer":"\\ud800"', "surrogate"),
    ('"extra":{}', '"extra":' + "[" * 70 + "]" * 70, "deeper"),
])
def test_each_parse_check_still_fires_on_a_receipt_line(ledger, old, new, expected):
    index = _receipt_index(ledger)
    _edit(ledger, index, old, new)
    assert expected in _faults_at(ledger, index)


def test_the_item_limit_still_fires_on_a_canonical_line(tmp_path):
    limits = DocumentLimits("tiny", max_bytes=1000, max_items=5)
    line = json.dumps({"a": [1, 2, 3, 4, 5]}, separators=(",", ":")).encode()  # canonical, 6 items
    assert parse_canonical(line, limits) is None
    with pytest.raises(DocumentLimitError, match="more than 5 items"):
        parse_json(line, limits)


def test_an_edited_value_breaks_the_hash_on_the_fast_path(ledger):
    index = _receipt_index(ledger)
    _edit(ledger, index, '"local_tokens":64', '"local_tokens":65')
    assert "do not match the entry's hash" in _faults_at(ledger, index)


@pytest.mark.parametrize("field,value,expected", [
    ("microbatches", 0, "microbatches"),
    ("global_examples_observed", 1, "global_examples_observed"),
    ("optimizer", "   ", "optimizer"),
    ("skipped", 1, "skipped"),
    ("step", -1, "step"),
])
def test_each_receipt_check_still_fires_with_a_valid_hash(ledger, field, value, expected):
    index = _receipt_index(ledger)
    _rehashed(ledger, index, lambda r: r["payload"]["receipt"]["data"].__setitem__(field, value))
    faults = _faults_at(ledger, index)
    assert "not a StepReceipt document" in faults and expected in faults
    assert "hash" not in faults.split("|")[0]


def test_a_hash_over_non_canonical_bytes_is_refused(ledger):
    """Hashing the line's own bytes is only sound for a canonical line: a spaced one is hashed canonically."""
    index = _receipt_index(ledger)
    lines = _lines(ledger)
    record = json.loads(lines[index])
    body = {k: v for k, v in record.items() if k != "hash"}
    spaced = json.dumps(body, sort_keys=True)  # ", " and ": " separators
    record["hash"] = "sha256:" + hashlib.sha256(spaced.encode()).hexdigest()
    lines[index] = json.dumps(record, sort_keys=True)
    ledger.write_text("\n".join(lines) + "\n")
    assert "do not match the entry's hash" in _faults_at(ledger, index)


@pytest.mark.parametrize("old,new", [
    ('"optimizer":"sgd"', '"optimizer":"s\\u0067d"'),  # an escape: the strict path, hashed canonically
    ('"certificate":"unverified","hash"', '"certificate": "unverified", "hash"'),  # spacing
])
def test_non_canonical_spellings_of_the_same_entry_still_verify_on_the_strict_path(ledger, old, new):
    index = _receipt_index(ledger)
    _edit(ledger, index, old, new)
    line = _lines(ledger)[index].encode()
    assert match_receipt(line) is None and parse_canonical(line, LEDGER_LINE_LIMITS) is None
    assert verify_ledger(ledger).ok  # as on the old main: the chain is defined over the canonical body


def test_the_receipt_pattern_gives_exactly_what_json_and_the_canonical_body_give(ledger):
    extras = [{}, {"admission": "unverified", "certificate": "unverified"}, {"n": -3, "ok": True, "x": None}]
    lines = [line for line in ledger.read_bytes().splitlines(keepends=True) if b'"kind":"receipt"' in line]
    variants = []
    for extra in extras:
        for loss in (1.0, 0.1, 1e-05, 2.5e+16, -0.0, 3):
            record = json.loads(lines[0])
            record["payload"]["receipt"]["data"].update(extra=extra, loss=loss, global_tokens_observed=128)
            record["payload"]["extra"] = extra
            variants.append(json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    for line in lines + variants:
        found = match_receipt(line)
        assert found is not None, line
        record = json.loads(line)
        assert found[0] == record and found[1] == _canonical({k: v for k, v in record.items() if k != "hash"})
        assert found.facts == receipt_facts(record["payload"]["receipt"])
        assert [type(v) for v in found[0]["payload"]["receipt"]["data"].values()] == \
            [type(v) for v in record["payload"]["receipt"]["data"].values()]


@pytest.mark.parametrize("old,new", [
    ('"loss":1.0', '"loss":1.00'), ('"loss":1.0', '"loss":1E0'), ('"loss":1.0', '"loss":1e400'),
    ('"rank":0', '"rank":-0'), ('"rank":0', '"rank":00'), ('"extra":{}', '"extra":{"b":1,"a":2}'),
    ('"extra":{}', '"extra":{"a":1,"a":2}'), ('"extra":{}', '"extra":{"a":"\\u00e9"}'),
    ('"extra":{}', '"extra":{"a":1.50}'), ('"step":0', '"step":1234567890123456789'),
    ('"global_examples_observed":null', '"global_examples_observed":7'),  # fewer than local_examples (8)
    ('"microbatches":1', '"microbatches":0'), ('"optimizer":"sgd"', '"optimizer":"  "'),
    ('"step":0', '"step":-1'), ('"seq":', '"seq":-'), ('"seq":', '"seq":9007199254740992'),
    ('"learning_rates":[]', '"learning_rates":[1]'), ('"learning_rates":[]', '"learning_rates":[1e400]'),
    ('"learning_rates":[]', '"learning_rates":[-0.5]'), ('"learning_rates":[]', '"learning_rates":[0.10]'),
    ('"learning_rates":[]', '"learning_rates":[0.1,]'),
])
def test_the_receipt_pattern_declines_every_non_canonical_token_and_every_invalid_receipt(ledger, old, new):
    line = next(line for line in _lines(ledger) if '"kind":"receipt"' in line and '"step":0' in line)
    edited = line.replace(old, new, 1).encode() + b"\n"
    assert edited != line.encode() + b"\n"
    assert match_receipt(edited) is None and scan_receipt(edited) is None


def test_learning_rates_read_by_the_pattern_are_what_the_strict_parser_reads(ledger):
    line = next(line for line in _lines(ledger) if '"kind":"receipt"' in line and '"step":0' in line)
    edited = line.replace('"learning_rates":[]', '"learning_rates":[0.001,0.5,0.0]', 1)
    found = match_receipt(edited.encode() + b"\n")
    assert found is not None
    assert found.record["payload"]["receipt"]["data"]["learning_rates"] == [0.001, 0.5, 0.0]
    assert receipt_from_document(found.record["payload"]["receipt"]).learning_rates == (0.001, 0.5, 0.0)


@pytest.mark.parametrize("line", [
    b'{"a":1,"a":2}', b'{"a":NaN}', b'{"a":Infinity}', b'{"a":-Infinity}', b'{"a":1e400}',
    b'{"a":99999999999999999999}', b'[-9223372036854775808]', b'{"a":"\\ud800"}', b'{"b":1,"a":2}',
    b'{"a": 1}', b'{"a":1.50}', '{"a":"\u00e9"}'.encode(), b'{"a":"\\u0041"}', b"[" * 65 + b"]" * 65, b"1",
    b'"text"', b'{"a":[1,2,]}', b"\xff", b'{"a":1}\n\n',
])
def test_parse_canonical_declines_what_is_not_provably_strict_and_canonical(line):
    assert parse_canonical(line, LEDGER_LINE_LIMITS) is None


@pytest.mark.parametrize("document", [
    {"a": 1, "b": [1, 2.5, None, True, "x"], "c": {"d": -9223372036854775}}, [], {}, [[[]]],
    {"s": "quote \" backslash \\ newline \n tab \t"}, {"f": [1e-05, 1e+16, -0.0, 0.1]},
])
def test_parse_canonical_returns_what_the_strict_parser_returns(document):
    line = json.dumps(document, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    assert parse_canonical(line, LEDGER_LINE_LIMITS) == parse_json(line, LEDGER_LINE_LIMITS) == document


def _receipt_document() -> dict:
    data = {"accumulation_steps": 1, "collective_bytes": 0, "data_parallel_size": 2, "extra": {},
            "global_examples_observed": None, "global_tokens_observed": None, "local_examples": 8,
            "local_tokens": 64, "loss": 1.0, "microbatches": 1, "optimizer": "sgd", "precision": "fp32",
            "skipped": False, "step": 3}
    return {"data": data, "kind": "StepReceipt", "version": 1}


@pytest.mark.parametrize("field,value", [
    (None, None), ("step", -1), ("step", True), ("step", 2**63), ("microbatches", 0), ("loss", None),
    ("loss", "1.0"), ("loss", True), ("optimizer", ""), ("optimizer", " "), ("optimizer", 3), ("skipped", 0),
    ("extra", {"a": [1]}), ("extra", {"certificate": "sha256:x", "admission": "certified"}), ("extra", []),
    ("global_examples_observed", 7), ("global_examples_observed", 8), ("global_tokens_observed", -1),
    ("collective_bytes", 1.0), ("kind", "Other"), ("version", 2), ("version", True), ("extra", {"a": 2**70}),
])
def test_receipt_facts_accepts_and_refuses_exactly_as_receipt_from_document(field, value):
    document = _receipt_document()
    if field in ("kind", "version"):
        document[field] = value
    elif field is not None:
        document["data"][field] = value
    try:
        receipt = receipt_from_document(json.loads(json.dumps(document)))
    except ContractError as exc:
        with pytest.raises(ContractError) as caught:
            receipt_facts(document)
        assert str(caught.value) == str(exc)
        return
    step, skipped, extra = receipt_facts(document)
    assert (step, skipped, FrozenDict(extra)) == (receipt.step, receipt.skipped, receipt.extra)


def test_iter_ledger_entries_are_the_same_on_both_paths(ledger):
    raw = [line.entry for line in iter_ledger(ledger, raw=True)]
    frozen = [line.entry for line in iter_ledger(ledger)]
    assert [e.body() for e in raw] == [json.loads(json.dumps(e.body(), default=dict)) for e in frozen]
    assert all(e.canonical in (None, _canonical(e.body())) for e in raw)
    assert sum(e.canonical is not None for e in raw) >= len(raw) - 4  # only run_starts read strictly here


# ---- property tests: the fast paths never accept what the strict path refuses, and agree where both accept ----
_SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
            | st.text(max_size=6))
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                           max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None, database=None)
@given(_JSON)
def test_parse_canonical_agrees_with_parse_json_on_any_document(document):
    for ascii_only in (True, False):
        line = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only).encode(
            "utf-8", "surrogatepass") + b"\n"
        try:
            strict = parse_json(line, LEDGER_LINE_LIMITS)
        except DocumentLimitError:
            assert parse_canonical(line, LEDGER_LINE_LIMITS) is None
            continue
        fast = parse_canonical(line, LEDGER_LINE_LIMITS)
        assert fast is None or fast == strict


_FIELD_VALUES = st.fixed_dictionaries({
    "step": st.integers(-2, 2**64), "local_examples": st.integers(0, 20), "microbatches": st.integers(-1, 3),
    "loss": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-5, 5), st.none()),
    "optimizer": st.text(max_size=4), "skipped": st.one_of(st.booleans(), st.integers(0, 1)),
    "global_examples_observed": st.one_of(st.none(), st.integers(0, 20)),
    "extra": st.dictionaries(st.text(max_size=3), _SCALARS, max_size=3),
})


@settings(max_examples=300, deadline=None, database=None)
@given(_FIELD_VALUES)
def test_the_receipt_pattern_agrees_with_the_strict_path_on_any_receipt(values):
    document = _receipt_document()
    document["data"].update(values)
    body = {"certificate": "unverified", "kind": "receipt", "payload": {"extra": {}, "rank": 0,
            "receipt": document, "step": 0}, "prev": "sha256:" + "0" * 64, "seq": 0, "time": "t"}
    try:
        line = json.dumps({**body, "hash": entry_hash(body)}, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    except ValueError:  # a NaN in extra: the writer cannot write it either
        return
    try:
        strict = parse_json(line, LEDGER_LINE_LIMITS)
        facts = receipt_facts(strict["payload"]["receipt"])
    except ContractError:  # a line or a receipt the strict path refuses: the pattern must decline it
        assert match_receipt(line) is None and scan_receipt(line) is None
        return
    found, scan = match_receipt(line), scan_receipt(line)
    assert (found is None) == (scan is None)
    if found is not None and scan is not None:
        assert found.record == strict and found.facts == facts and found.canonical == _canonical(body)
        assert (scan.step, scan.skipped, scan.extra) == facts and scan.canonical == found.canonical
        assert (scan.seq, scan.rank, scan.payload_step, scan.hash) == (0, 0, 0, strict["hash"])
