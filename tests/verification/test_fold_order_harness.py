"""The harness checks what the run-time audit checks (issue 35 item 3): an EM backend claims the bits of one process,
so one that hands back two chunks' results swapped -- within rounding of the one-piece reference and the same on any
worker count -- fails ``verify``, ``conformance`` and ``certify``; ``verify`` and ``certify`` write JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.verification.cli_commands import main_certify, main_verify
from mixle_parallel.verification.conformance.suite import main_conformance
from mixle_parallel.verification.harness.run import verify

SWAPPED = "tests.verification.swapped_em"
TEMPLATE = "examples.em_backend_template"
ARGS = ["--plan", "dp_replicate=2", "--precision", "fp64", "--workload", "gaussian_mixture"]


def _cases(path) -> dict[str, ET.Element]:
    suites = ET.parse(path).getroot()
    return {case.get("name"): case for case in suites.iter("testcase")}


def test_verify_refuses_chunks_folded_out_of_order():
    import tests.verification.swapped_em  # noqa: F401 - registers swapped_em

    report = verify("swapped_em", ParallelPlan(dp_replicate=2), precision="fp64", workload="gaussian_mixture")
    assert not report.passed and report.failed_checks == {"determinism"}
    assert "differs in bits from the fixed fold order (em_local in one process)" in report.failures[0]
    assert report.evidence[0].maximum_relative_error < 1e-12  # within the one-piece bound: only the bits tell


def test_a_backend_with_the_bits_of_one_process_still_passes():
    import examples.em_backend_template  # noqa: F401 - registers template_em

    report = verify("template_em", ParallelPlan(dp_replicate=3), precision="fp64", workload="gaussian_mixture")
    assert report.passed, report.summary()


def test_verify_command_fails_it_and_writes_junit(tmp_path, capsys):
    out = tmp_path / "verify.xml"
    assert main_verify(["--backend", "swapped_em", "--import", SWAPPED, *ARGS, "--junit-xml", str(out)]) == 1
    case = _cases(out)["update stats:data"]
    assert "fixed fold order" in case.find("failure").get("message")
    assert ET.parse(out).getroot().find("testsuite").get("name") == "mixle-parallel verify"


def test_conformance_fails_it(tmp_path, capsys):
    out = tmp_path / "conformance.xml"
    assert main_conformance(["--backend", "swapped_em", "--import", SWAPPED, "--plan", "dp_replicate=2",
                             "--precision", "fp64", "--junit-xml", str(out)]) == 1
    failed = {name for name, case in _cases(out).items() if case.find("failure") is not None}
    assert "check_harness_admits" in failed
    assert "fixed fold order" in capsys.readouterr().out


def test_certify_refuses_it_and_writes_junit(tmp_path, capsys):
    out, cert = tmp_path / "certify.xml", tmp_path / "cert.json"
    assert main_certify(["--backend", "swapped_em", "--import", SWAPPED, *ARGS, "--out", str(cert),
                         "--junit-xml", str(out)]) == 1
    assert not cert.exists()
    cases = _cases(out)
    assert cases["update stats:data"].find("failure") is not None
    assert "not certified" in cases["certificate"].find("failure").get("message")


@pytest.mark.parametrize("command", [main_verify, main_certify])
def test_a_passing_backend_writes_passing_junit(tmp_path, capsys, command):
    out = tmp_path / "ok.xml"
    assert command(["--backend", "template_em", "--import", TEMPLATE, *ARGS, "--junit-xml", str(out)]) == 0
    root = ET.parse(out).getroot()
    assert root.get("failures") == "0" and "update stats:data" in _cases(out)
    if command is main_certify:
        assert "signed by key" in _cases(out)["certificate"].find("system-out").text
