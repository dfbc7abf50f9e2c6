"""The conformance suite, through its CLI function and as a pytest plugin, on the toy backends."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from mixle_parallel.verification.conformance.suite import main_conformance, parse_plan, run_conformance

REPO_ROOT = Path(__file__).resolve().parents[2]
"""On the child pytest's PYTHONPATH, so ``tests.verification.toy_executors`` imports there."""
TOYS = "tests.verification.toy_executors"


def test_cli_passes_the_correct_toy(capsys):
    assert main_conformance(["--backend", f"{TOYS}:ToyDDPExecutor"]) == 0
    out = capsys.readouterr().out
    assert "9/9 checks passed" in out and "PASS  check_harness_admits" in out
    assert "PASS  check_updates_on_the_wire" in out and "grad:dp_shard: all_reduce x" in out


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


def _run_plugin(folder: Path, *args: str) -> tuple[dict[str, int], str]:
    """A child pytest in ``folder`` running the conformance plugin with ``args``: its outcome counts and output.

    A plain subprocess, not pytest's own test-running fixture: that fixture restores ``sys.modules`` by
    clearing it and filling it again, and an engine thread of this session (Ray's, Spark's) importing in
    between builds a second ``_io`` module, whose exceptions later tests no longer catch as ``io``'s."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *_plugin_args(), *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    summary = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    assert summary, f"the child pytest printed no outcome:\n{output}"
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|errors?)", summary[-1])}, output


def test_pytest_plugin_runs_the_suite(tmp_path):
    good, output = _run_plugin(tmp_path, "--mixle-backend", f"{TOYS}:ToyEMExecutor", "--mixle-plan", "dp_replicate=2",
                               "--mixle-precision", "fp64", "-q")
    assert good == {"passed": 9}, output
    bad, output = _run_plugin(tmp_path, "--mixle-backend", f"{TOYS}:PerWorkerEMExecutor",
                              "--mixle-plan", "dp_replicate=3", "--mixle-precision", "fp64", "-q")
    assert bad == {"passed": 8, "failed": 1}, output
    named = r"test_harness_admits[\s\S]*check 'determinism' failed.*differs in bits from 1 worker"
    assert re.search(named, output), output


def test_verify_and_certify_commands(tmp_path, capsys):
    from mixle_parallel.verification.admission import load_certificate
    from mixle_parallel.verification.attestation import open_envelope
    from mixle_parallel.verification.cli_commands import main_certify, main_keys, main_verify

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


class _PrepareToy:
    """A toy DDP executor whose prepare() refuses (or not) the way its ``mode`` says."""

    def __init__(self, mode: str) -> None:
        from tests.verification.toy_executors import ToyDDPExecutor

        self._toy, self.mode = ToyDDPExecutor(), mode
        self.capabilities, self.version = self._toy.capabilities, self._toy.version

    def describe_updates(self, plan):
        return self._toy.describe_updates(plan)

    def prepare(self, module, *, plan, loss_fn, precision="fp32"):
        import torch.distributed as dist

        if self.mode == "group_first":  # joins a (one-rank) world before checking the plan
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        if self.mode == "accepts":
            return object()
        self.capabilities.validate(plan, precision)


@pytest.mark.parametrize("mode, passed, words", [
    ("refuses", True, "refused pp, cp, tp=2 with CapabilityError"),
    ("accepts", False, "accepted a plan on unclaimed axis pp"),
    ("group_first", False, "created a process group before refusing"),
])
def test_prepare_must_refuse_unclaimed_axes_before_any_process_group(mode, passed, words):
    result = {r.name: r for r in run_conformance(_PrepareToy(mode), skip_harness=True)}[
        "check_prepare_refuses_unclaimed_axes"]
    assert result.passed is passed and words in result.detail, result.detail
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_torch_native_prepare_refuses_pp_and_a_junit_report_is_written(tmp_path, capsys):
    report = tmp_path / "conformance.xml"
    code = main_conformance(["--backend", "mixle_parallel.executors.torch.harness_adapter:VerifiableTorchNative",
                             "--skip-harness", "--junit-xml", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "refused pp=2 with CapabilityError, no process group created" in out
    import xml.etree.ElementTree as ET

    suite = ET.parse(report).getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert suite.get("tests") == "6" and suite.get("failures") == "0"
    measured = cases["check_declared_updates"].find("properties/property").get("value")
    assert measured.startswith("dp_shard=2") and "grad:dp_shard" in measured
