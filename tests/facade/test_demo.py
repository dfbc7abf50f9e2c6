"""The main job end to end: certificates, training receipts, EM, and a ledger that audits clean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType

import pytest
from rich.console import Console

from mixle_parallel import CertificateEnvelope, StepReceipt, from_dict, from_json, open_envelope, verify_ledger
from mixle_parallel.demo import run as demo_run
from mixle_parallel.demo.run import LEGEND, OUTPUTS, STORE, TERMS, describe_audits, legend, recheck_command
from mixle_parallel.demo.train import audit_counts

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_runs_certified_audited_and_its_ledger_verifies(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "mixle_parallel", "demo", "--out", str(out), "--steps", "6",
                           "--em-rows", "20000"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "audit ledger" in done.stdout
    assert f"re-check the ledger any time: mixle-parallel audit {out / 'ledger.jsonl'}\n" in done.stdout
    torch_cert, torch_key = open_envelope(from_json((out / "certificate-torch_native.json").read_text(),
                                                    CertificateEnvelope))  # signed by a trusted key
    em_cert, em_key = open_envelope(from_json((out / "certificate-em_mp.json").read_text(), CertificateEnvelope))
    assert torch_key == em_key
    assert torch_cert.executor == "torch_native" and em_cert.executor == "em_mp"
    receipts = [from_dict(json.loads(line), StepReceipt) for line in (out / "receipts.jsonl").read_text().splitlines()]
    assert len(receipts) == 6 and all(r.extra["certificate"] == torch_cert.certificate_id for r in receipts)
    report = verify_ledger(out / "ledger.jsonl")
    assert report.ok, report.faults
    assert report.signed_head.startswith(f"signed head: {report.entries} entries") and torch_key[:16] in \
        report.signed_head
    assert report.runs == 2 and report.audits >= 2  # training and EM each audit at least one unit
    summary = json.loads((out / "summary.json").read_text())
    assert summary["signed_head"] == report.signed_head
    assert summary["training"]["findings"] == 0 and summary["em"]["findings"] == 0
    assert summary["training"]["last_loss"] < summary["training"]["first_loss"]
    from mixle_parallel.run_verification import verify_run

    verdict = verify_run(out)  # certificates, ledger, the checkpoint, both provenance statements, their agreement
    assert verdict.ok, verdict.failures
    assert {c.target for c in verdict.checks if c.check == "provenance"} == {
        "checkpoints/gen-00000001.intoto.json", "em-model.intoto.json"}
    assert "verify-run" in done.stdout and 'data-plot="em_loglik"' in (out / "report.html").read_text()
    # the demo tells the truth (issue 35 item 6): how each audit was compared, no torch notices, no straggler
    # in a healthy run, and each phase announced before it runs
    train_row = next(line for line in done.stdout.splitlines() if "train tiny LM" in line)
    assert "bitwise" in train_row and "within" in train_row  # tensor parallelism's reference: within a bound
    assert summary["training"]["within_bound"] > 0 and summary["training"]["max_bound"] > 0
    assert summary["em"]["within_bound"] == 0 and summary["em"]["bitwise"] == summary["em"]["audits"]
    assert "While redistributing" not in done.stdout + done.stderr
    assert not [a for r in receipts for a in r.extra["health"]["anomalies"] if a["kind"] == "straggler"]
    phases = [done.stdout.index(f"[{n}/4]") for n in (1, 2, 3, 4)]
    assert phases == sorted(phases) and phases[0] < done.stdout.index("evidence: torch_native")


def test_demo_rejects_unknown_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from mixle_parallel.cli import main

    with pytest.raises(SystemExit) as info:
        main(["demo", "--no-such-flag"])
    assert info.value.code == 2


def test_demo_help_says_where_everything_lands(capsys: pytest.CaptureFixture[str]) -> None:
    from mixle_parallel.cli import main

    with pytest.raises(SystemExit) as info:
        main(["demo", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in OUTPUTS:
        assert name in text
    for where in ("$MIXLE_PARALLEL_HOME", "$XDG_CONFIG_HOME/mixle-parallel", "~/.config/mixle-parallel",
                  "signing-key.pem", "certificates/<id>.json"):
        assert where in text
    assert "audits:" in text and "findings:" in text


def _rendered(table: object) -> str:
    console = Console(width=200, record=True)
    console.print(table)
    return " ".join(console.export_text().split())


def test_legend_names_every_file_the_store_and_the_command_as_the_user_runs_it(tmp_path: Path) -> None:
    out = tmp_path / "mixle-parallel-run"
    via_dev = {"MIXLE_PARALLEL_CLI": "scripts/dev run", "MIXLE_PARALLEL_HOME": "/keys"}
    text = _rendered(legend(out, via_dev, tmp_path))
    assert "/keys: the signing key" in text and "into mixle-parallel-run/" in text
    for name, words in (*LEGEND, *TERMS):
        assert name in text and " ".join(words.split()) in text
    assert recheck_command(out, via_dev, tmp_path) == "scripts/dev run audit mixle-parallel-run/ledger.jsonl"
    assert "/xdg/mixle-parallel: the signing key" in _rendered(legend(out, {"XDG_CONFIG_HOME": "/xdg"}, tmp_path))
    assert recheck_command(out, {}, tmp_path / "other") == f"mixle-parallel audit {out / 'ledger.jsonl'}"


def test_readme_explains_what_the_demo_wrote() -> None:
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    for name, text in (*LEGEND, *TERMS):
        assert f"`{name}`" in readme and text in readme, name
    assert STORE in readme


def test_the_table_says_which_audits_were_bitwise_and_within_which_bound() -> None:
    tp = {"bound": 8.85e-05, "matched": True, "replay": "reference"}
    peer = {"bound": 0.0, "matched": True, "replay": "peer"}
    frozen = MappingProxyType(tp)  # a receipt's extra keeps its records as frozen mappings
    counts = audit_counts([frozen, peer, tp, peer, {**peer, "matched": False}])
    assert describe_audits(counts) == "5 audits (3 bitwise, 2 within 8.85e-05), 1 findings"
    assert describe_audits(audit_counts([peer, peer])) == "2 audits (all bitwise), 0 findings"
    words = dict(TERMS)["audits"]
    assert "within a stated bound" in words and "compared bitwise with the original" not in words


def test_the_audit_reference_gather_drops_only_torchs_sequential_gather_notice() -> None:
    import logging

    from mixle_parallel.executors.torch.sdc_reference import quiet_sequential_gather_notice

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    logger, kept = logging.getLogger("torch.distributed.tensor._redistribute"), Keep()
    notice = "While redistributing from %s to %s, %d sequential %s operations will be performed. %s"
    logger.addHandler(kept)
    try:
        with quiet_sequential_gather_notice():
            logger.warning(notice, "(_StridedShard(dim=0, sf=2), Shard(dim=0))", "(Replicate(), Replicate())", 2,
                           "all_gather", "")
            logger.warning("some other DTensor warning")
        logger.warning(notice, "a", "b", 2, "all_gather", "")  # outside our call: left alone
    finally:
        logger.removeHandler(kept)
    assert kept.messages[0] == "some other DTensor warning" and len(kept.messages) == 2
    assert kept.messages[1].startswith("While redistributing from a to b")


def test_a_phase_without_a_terminal_prints_progress_as_it_goes(monkeypatch) -> None:
    import io
    import time

    monkeypatch.setattr(demo_run, "PLAIN_PROGRESS_EVERY", 0.05)
    console = Console(file=io.StringIO(), width=120)  # a log or a pipe: not a terminal
    with demo_run._ticker(console, "certifying torch_native"):
        time.sleep(0.3)
    for step in range(1, 4):
        demo_run._plain_progress(console, "step", step, 3, f"loss {step}.0")
    text = console.file.getvalue()
    assert "certifying torch_native: 0 s" in text and text.count("certifying torch_native") >= 2
    assert "step 1/3, loss 1.0" in text
