"""The conformance suite, through its CLI function and as a pytest plugin, on the toy backends."""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from mixle_parallel.verification.conformance.suite import main_conformance, parse_plan, run_conformance

REPO_ROOT = Path(__file__).resolve().parents[2]
"""On the child pytest's PYTHONPATH, so ``tests.verification.toy_executors`` imports there."""
TOYS = "tests.verification.toy_executors"
pytest_plugins = ["pytester"]


def test_cli_passes_the_correct_toy(capsys):
    assert main_conformance(["--backend", f"{TOYS}:ToyDDPExecutor"]) == 0
    out = capsys.readouterr().out
    assert "6/6 checks passed" in out and "PASS  check_harness_admits" in out


def test_cli_rejects_the_wrong_group_toy_naming_the_check(capsys):
    code = main_conformance(["--backend", f"{TOYS}:WrongGroupDDPExecutor", "--plan", "dp_replicate=2,dp_shard=2"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  check_harness_admits" in out and "check 'numerics' failed" in out
    assert "failed: check_harness_admits" in out


class NotAnExecutor:
    capabilities = "everything"
    version = ""

    def describe_updates(self, plan):
        return ()


def test_contract_checks_name_what_is_wrong():
    results = {r.name: r for r in run_conformance(NotAnExecutor(), skip_harness=True)}
    assert not results["check_identity"].passed and "BackendCapabilities" in results["check_identity"].detail
    assert main_conformance(["--backend", f"{TOYS}:ToyEMExecutor", "--plan", "tp=x"]) == 2


def test_parse_plan():
    assert parse_plan("dp_shard=2, tp=2").world_size == 4 and parse_plan("") is None
    with pytest.raises(ValueError, match="unknown ParallelPlan fields"):
        parse_plan("dq=2")


def _plugin_args() -> list[str]:
    registered = any(ep.value.startswith("mixle_parallel.verification.conformance.plugin")
                     for ep in entry_points(group="pytest11"))
    return [] if registered else ["-p", "mixle_parallel.verification.conformance.plugin"]


def test_pytest_plugin_runs_the_suite(pytester):
    env_path = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    pytester._monkeypatch.setenv("PYTHONPATH", env_path)
    good = pytester.runpytest_subprocess(*_plugin_args(), "--mixle-backend", f"{TOYS}:ToyEMExecutor",
                                         "--mixle-plan", "dp_replicate=2", "--mixle-precision", "fp64", "-q")
    good.assert_outcomes(passed=6)
    bad = pytester.runpytest_subprocess(*_plugin_args(), "--mixle-backend", f"{TOYS}:PerWorkerEMExecutor",
                                        "--mixle-plan", "dp_replicate=3", "--mixle-precision", "fp64", "-q")
    bad.assert_outcomes(passed=5, failed=1)
    bad.stdout.fnmatch_lines(["*test_harness_admits*", "*check 'determinism' failed*differs in bits from 1 worker*"])
    assert sys.executable


def test_verify_and_certify_commands(tmp_path, capsys):
    from mixle_parallel.verification.admission import load_certificate
    from mixle_parallel.verification.attestation import open_envelope
    from mixle_parallel.verification.cli import main_certify, main_keys, main_verify

    spec = f"{TOYS}:ToyEMExecutor"
    common = ["--backend", spec, "--plan", "dp_replicate=2", "--precision", "fp64", "--workload", "gaussian_mixture"]
    assert main_verify(common) == 0
    assert "PASSED" in capsys.readouterr().out
    assert main_keys(["list"]) == 0
    assert main_certify([*common, "--out", str(tmp_path / "cert.json")]) == 0
    out = capsys.readouterr().out
    cert, keyid = open_envelope(load_certificate(tmp_path / "cert.json"))  # signed by this machine's key
    assert f"certificate {cert.certificate_id} signed by key {keyid[:16]}" in out and "stored in" in out
    bad = ["--backend", f"{TOYS}:PerWorkerEMExecutor", "--plan", "dp_replicate=3", "--precision", "fp64",
           "--workload", "gaussian_mixture"]
    assert main_verify(bad) == 1
    assert main_certify([*bad, "--out", str(tmp_path / "bad.json")]) == 1
    assert not (tmp_path / "bad.json").exists()
    assert main_verify(["--backend", spec, "--plan", "nope"]) == 2
