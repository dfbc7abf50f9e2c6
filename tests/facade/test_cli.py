"""The CLI: plan tables, JSON, schema output, backend checks, and one clear line with exit 2 on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mixle_parallel import BackendCapabilities, ParallelPlan, to_json
from mixle_parallel.cli import main
from mixle_parallel.executors import register_training_backend, unregister_training_backend


def test_plan_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--dp-shard", "2", "--tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "dp_shard=2 x tp=2 (world 4)" in out
    assert "[0,1]  [2,3]" in out and "[0,2]  [1,3]" in out


def test_plan_json_matches_plan_math(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--dp-replicate", "2", "--dp-shard", "2", "--json"]) == 0
    layout = json.loads(capsys.readouterr().out)
    plan = ParallelPlan(dp_replicate=2, dp_shard=2)
    assert layout["ranks"] == [plan.coordinate(r).as_dict() for r in range(4)]
    assert layout["groups"]["dp_shard"] == [[0, 1], [2, 3]]


def test_plan_file_document_and_plain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "plan.json"
    doc.write_text(to_json(ParallelPlan(pp=2)))
    assert main(["plan", "--plan", str(doc)]) == 0
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"tp": 2, "cp": 2}))
    assert main(["plan", "--plan", str(plain)]) == 0
    assert "cp=2 x tp=2" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["plan", "--dp-shard", "2", "--ep", "3"], "ep=3 must divide"),
    (["plan", "--tp", "0"], "tp must be >= 1"),
    (["plan", "--plan", "/nonexistent.json"], "cannot read plan file"),
    (["plan", "--plan", "/dev/null", "--tp", "2"], "not both"),
    (["plan", "--backend", "no-such-backend"], "unknown training backend"),
    (["schema", "NoSuchKind"], "unknown contract kind"),
])
def test_bad_input_exits_2_with_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_bad_plan_file_contents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for content, message in [("{", "is not JSON"), ("[1]", "JSON object"), ('{"tensor": 2}', "unknown ParallelPlan"),
                             ('{"kind": "ParallelPlan", "version": 1, "data": {"tp": 2}}', "required field missing")]:
        path = tmp_path / "p.json"
        path.write_text(content)
        assert main(["plan", "--plan", str(path)]) == 2
        assert message in capsys.readouterr().err


class _Toy:
    capabilities = BackendCapabilities("toy_cli", {"dp_shard"}, precisions={"fp32"})
    version = "0"

    def prepare(self, module: Any, *, plan: ParallelPlan, **kwargs: Any) -> Any:
        return module


def test_backend_capability_check(capsys: pytest.CaptureFixture[str]) -> None:
    register_training_backend("toy_cli", _Toy())
    try:
        assert main(["plan", "--dp-shard", "2", "--backend", "toy-cli"]) == 0
        assert "executes this plan" in capsys.readouterr().out
        assert main(["plan", "--tp", "2", "--backend", "toy_cli"]) == 2
        assert "does not execute axis tp" in capsys.readouterr().err
        assert main(["plan", "--backend", "toy_cli", "--precision", "bf16"]) == 2
    finally:
        unregister_training_backend("toy_cli")


def test_schema_lists_and_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert "ParallelPlan" in capsys.readouterr().out.split()
    assert main(["schema", "StepReceipt"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "StepReceipt"


def test_console_script_runs() -> None:
    exe = Path(sys.executable).with_name("mixle-parallel")
    out = subprocess.run([str(exe), "plan", "--tp", "2", "--ep", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("error: ")
    out = subprocess.run([sys.executable, "-m", "mixle_parallel", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "mixle-parallel" in out.stdout


def test_verification_commands_take_registry_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--backend", "no-such", "--plan", "pp=2"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'no-such'" in err and "torch_native" in err and "mp" in err and "--import MODULE" in err
    assert main(["certify", "--backend", "no-such", "--plan", "dp_shard=2", "--out", "/dev/null"]) == 2
    assert main(["conformance", "--backend", "no-such"]) == 2
    assert "unknown backend 'no-such'" in capsys.readouterr().err
    assert main(["verify", "--backend", "model_parallel", "--plan", "dp_replicate=2"]) == 2  # wraps another
    assert "registered but cannot be verified by itself" in capsys.readouterr().err
    assert main(["verify", "--backend", "mp", "--plan", "dp_replicate=2", "--import", "no_such_module_xyz"]) == 2
    assert "--import no_such_module_xyz: cannot import it" in capsys.readouterr().err


def test_certify_then_audit_pass_through(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """EM on the mp backend (2 real worker processes) certified from the CLI by its registry name."""
    cert = tmp_path / "cert.json"
    assert main(["certify", "--backend", "mp", "--plan", "dp_replicate=2", "--workload", "gaussian_mixture",
                 "--out", str(cert)]) == 0
    from mixle_parallel import CertificateEnvelope, from_json, open_envelope

    certificate, _ = open_envelope(from_json(cert.read_text(), CertificateEnvelope))
    assert certificate.executor == "em_mp" and certificate.precision == "fp64"
    assert main(["audit", str(tmp_path / "missing.jsonl")]) != 0
    capsys.readouterr()


def test_pass_through_help_reaches_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["audit", "--help"])
    assert info.value.code == 0
    assert "usage: mixle-parallel audit" in capsys.readouterr().out


# ---- a third party's EM backend, registered by its own module, found by a fresh CLI process ---------
_ACME = '''"""A third party's EM backend: the local thread runner under its own name, registered on import."""
from mixle_parallel import handle_from_runner, register_encoded_data_backend
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner


class AcmeRunner(LocalChunkRunner):
    name = "acme_em"


def acme_em(data, *, num_workers=None, **options):
    return handle_from_runner(AcmeRunner(num_workers or 1), data, **options)


acme_em.encoded_data_options = frozenset({"num_workers"})
acme_em.planned_workers = lambda options: options.num_workers or 1
acme_em.worker_processes = False
register_encoded_data_backend("acme_em", acme_em)
'''


def _acme_package(folder: Path, *, entry_point: bool) -> dict[str, str]:
    """Write the backend module (and, with ``entry_point``, package metadata declaring it); a child's env."""
    (folder / "acme_backend.py").write_text(_ACME, encoding="utf-8")
    if entry_point:
        meta = folder / "acme_backend-1.0.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-backend\nVersion: 1.0\n", encoding="utf-8")
        (meta / "entry_points.txt").write_text("[mixle_parallel.backends]\nacme_em = acme_backend\n", encoding="utf-8")
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mixle_parallel", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def test_a_third_party_em_backend_by_name_from_a_fresh_process(tmp_path: Path) -> None:
    """--import MODULE registers it for verify; without it the name is unknown, and the error lists the names."""
    env = _acme_package(tmp_path, entry_point=False)
    unknown = _cli(["verify", "--backend", "acme_em", "--plan", "dp_replicate=2"], env, tmp_path)
    assert unknown.returncode == 2 and "unknown backend 'acme_em'" in unknown.stderr
    assert "registered EM (encoded-data) backends: " in unknown.stderr and "mp" in unknown.stderr
    done = _cli(["verify", "--backend", "acme_em", "--plan", "dp_replicate=2", "--import", "acme_backend"], env,
                tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "em_acme_em 1.0.0 on dp_replicate=2 (world 2) at fp64" in done.stdout and "PASSED" in done.stdout


def test_a_third_party_em_backend_by_entry_point(tmp_path: Path) -> None:
    """An entry point in mixle_parallel.backends is loaded for an unregistered name: conformance passes by name."""
    env = _acme_package(tmp_path, entry_point=True)
    done = _cli(["conformance", "--backend", "acme_em", "--plan", "dp_replicate=2"], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9/9 checks passed" in done.stdout and "PASS  check_harness_admits" in done.stdout
    assert "stats:data: custom" in done.stdout and "self-reported by the executor" in done.stdout
    unknown = _cli(["verify", "--backend", "acme_typo", "--plan", "dp_replicate=2"], env, tmp_path)
    assert unknown.returncode == 2 and "acme_em" in unknown.stderr  # the whole group was loaded to list names


def test_verify_and_conformance_take_a_registered_em_name_in_python(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from mixle_parallel import run_conformance, verify
    from mixle_parallel.executors import unregister_encoded_data_backend

    monkeypatch.syspath_prepend(str(tmp_path))
    _acme_package(tmp_path, entry_point=False)
    import importlib

    importlib.import_module("acme_backend")
    try:
        plan = ParallelPlan(dp_replicate=2)
        report = verify("acme_em", plan, precision="fp64")
        assert report.passed and report.executor == "em_acme_em", report.summary()
        results = run_conformance("acme_em", plan=plan)
        assert all(r.passed for r in results), [(r.name, r.detail) for r in results if not r.passed]
        with pytest.raises(ValueError, match="unknown backend 'acme_emm'.*acme_em"):
            verify("acme_emm", plan)
    finally:
        unregister_encoded_data_backend("acme_em")
        sys.modules.pop("acme_backend", None)
