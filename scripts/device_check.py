"""The CUDA check, one call: the device tests, EM on the GPU, a bf16 certificate and an in-situ certification.

Run it through ``scripts/device-check OUT_DIR`` (which prepares the Python it runs under); this module does
the work. Parts, each a child process with its own time limit, its output appended to ``OUT/log.txt``:

1. ``environment``: Python, torch, CUDA, the device name and count.
2. ``tests``: ``pytest -m device`` over ``tests/`` with a JUnit report (``OUT/junit-device.xml``); tests that
   need two or more GPUs stay skipped, and the summary lists each skip with its reason.
3. ``em``: ``benchmarks/em_device.py`` (the torch kernel on CUDA in fp32 and fp64 against the numpy kernel on
   the CPU and scikit-learn, 10M x 8, K=8: time to a converged fit, log-likelihood reached).
4. ``bf16``: ``mixle-parallel certify`` of ``torch_native`` on one rank at bf16 (on the GPU: the harness's
   single-process fp32 reference against the executor in bf16), the errors per update that certificate holds.
5. ``in_situ``: ``torchrun`` of ``scripts/device_in_situ_job.py`` on a fresh trust store: ``prepare`` certifies
   ``torch_native`` in situ on the GPU before its first step.

Without CUDA, parts 3-5 are reported as ``not run (no device)`` and the check exits 0; ``--cpu-dry-run`` runs
them on the CPU at a small size instead, so the script's own logic is exercised on any machine. Writes
``OUT/summary.json`` and ``OUT/summary.md`` (the table it prints) beside the JUnit report and the log: four
files, within what the device tool brings back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NO_DEVICE = "not run (no device)"

PART_LIMITS_S = {"environment": 60, "tests": 150, "em": 240, "bf16": 90, "in_situ": 120}
"""Each part's wall-clock limit on the GPU machine: 11 minutes at most in all, ~5-6 in practice."""


def _torch_facts() -> dict[str, Any]:
    """What torch says about this machine (never raises: an import failure is a fact too)."""
    try:
        import torch
    except ImportError as exc:
        return {"torch": None, "cuda": False, "error": f"torch not importable: {exc}"}
    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": bool(torch.cuda.is_available()),
                             "cuda_version": torch.version.cuda}
    if facts["cuda"]:
        facts["device_count"] = torch.cuda.device_count()
        facts["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return facts


class Check:
    """One run of the check: where it writes, how it runs its parts, what they found."""

    def __init__(self, out: Path, *, cpu_dry_run: bool, em_rows: int | None, em_budget_s: float) -> None:
        self.out = out
        self.cpu_dry_run = cpu_dry_run
        self.em_rows = em_rows
        self.em_budget_s = em_budget_s
        self.log = out / "log.txt"
        self.parts: dict[str, dict[str, Any]] = {}
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.env["PYTHONUNBUFFERED"] = "1"

    def run(self, part: str, argv: list[str], *, env: dict[str, str] | None = None) -> tuple[int, str]:
        """``argv`` as a child process within the part's limit; its output goes to the log. (exit code, output)"""
        limit = PART_LIMITS_S[part]
        started = time.perf_counter()
        with self.log.open("a", encoding="utf-8") as log:
            log.write(f"\n===== {part}: {' '.join(argv)}\n")
            log.flush()
            try:
                done = subprocess.run(argv, cwd=ROOT, env=env or self.env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, timeout=limit)
                code, output = done.returncode, done.stdout
            except subprocess.TimeoutExpired as exc:
                raw = exc.stdout or ""
                code, output = 124, (raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
                output += f"\n[device-check] {part} stopped at its {limit} s limit\n"
            log.write(output)
        self.parts.setdefault(part, {})["seconds"] = round(time.perf_counter() - started, 1)
        return code, output

    # -- the parts ----------------------------------------------------------------------------------
    def environment(self) -> dict[str, Any]:
        facts = {"python": sys.version.split()[0], "executable": sys.executable, "machine": platform.machine(),
                 **_torch_facts()}
        smi = shutil.which("nvidia-smi")
        if smi:
            code, text = self.run("environment", [smi, "--query-gpu=name,memory.total,driver_version",
                                                  "--format=csv,noheader"])
            facts["nvidia_smi"] = text.strip() if code == 0 else f"exit {code}"
        self.parts["environment"] = {"status": "ok", **facts}
        return facts

    def tests(self) -> None:
        junit = self.out / "junit-device.xml"
        code, _ = self.run("tests", [sys.executable, "-m", "pytest", "-m", "device", "tests", "-q", "-rs",
                                     "--continue-on-collection-errors",
                                     "-p", "no:cacheprovider", f"--junitxml={junit}"])
        counts = junit_counts(junit) if junit.is_file() else {}
        # pytest: 0 all passed, 1 failures, 5 nothing collected; skips are not failures
        status = "ok" if code in (0, 5) and not counts.get("failed") else f"failed (pytest exit {code})"
        self.parts["tests"].update(status=status, **counts)

    def em(self, cuda: bool) -> None:
        if not cuda and not self.cpu_dry_run:
            self.parts["em"] = {"status": NO_DEVICE}
            return
        rows = self.em_rows or (10_000_000 if cuda else 20_000)
        libraries = "torch-cuda-fp32,torch-cuda-fp64,numpy,sklearn" if cuda else "torch-cpu-fp64,numpy,sklearn"
        report = self.out / ".em.json"
        code, _ = self.run("em", [sys.executable, "benchmarks/em_device.py", "--rows", str(rows), "--dims", "8",
                                  "--k", "8", "--budget-s", str(self.em_budget_s), "--libraries", libraries,
                                  "--json", str(report)])
        result = json.loads(report.read_text(encoding="utf-8")) if code == 0 and report.is_file() else {}
        report.unlink(missing_ok=True)
        self.parts["em"].update({"rows": rows, **result, "device": "cuda" if cuda else "cpu (dry run)",
                                 "status": "ok" if result else f"failed (exit {code}; see log.txt)"})

    def bf16(self, cuda: bool) -> None:
        if not cuda and not self.cpu_dry_run:
            self.parts["bf16"] = {"status": NO_DEVICE}
            return
        cert = self.out / ".certificate-bf16.json"
        env = dict(self.env, MIXLE_PARALLEL_HOME=tempfile.mkdtemp(prefix="device-check-home-"))
        code, output = self.run("bf16", [sys.executable, "-m", "mixle_parallel", "certify", "--backend",
                                         "torch_native", "--plan", "dp_replicate=1", "--precision", "bf16",
                                         "--workload", "tiny_lm", "--no-store", "--out", str(cert)], env=env)
        evidence = certificate_errors(cert) if cert.is_file() else []
        cert.unlink(missing_ok=True)
        table = [line for line in output.splitlines() if line.strip()][:12]
        self.parts["bf16"].update(status="ok" if code == 0 and evidence else f"failed (exit {code}; see log.txt)",
                                  device="cuda" if cuda else "cpu (dry run)", evidence=evidence, printed=table)

    def in_situ(self, cuda: bool) -> None:
        if not cuda and not self.cpu_dry_run:
            self.parts["in_situ"] = {"status": NO_DEVICE}
            return
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
        report = self.out / ".in-situ.json"
        env = dict(self.env, MIXLE_PARALLEL_HOME=tempfile.mkdtemp(prefix="device-check-home-"))
        ranks = "1" if cuda else "2"  # one GPU is already a device mesh; on the CPU a mesh needs two ranks
        argv = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"])
        code, _ = self.run("in_situ", [*argv, "--nproc-per-node", ranks, "scripts/device_in_situ_job.py",
                                       str(report)], env=env)
        found = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
        report.unlink(missing_ok=True)
        ok = code == 0 and found.get("admission") == "certified"
        self.parts["in_situ"].update({**found, "device": found.get("device", "cpu (dry run)"),
                                      "status": "ok" if ok else f"failed (exit {code}; see log.txt)"})


def junit_counts(path: Path) -> dict[str, Any]:
    """Passed/failed/skipped counts of a pytest JUnit report, and each skip's reason."""
    suites = ET.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    reasons: dict[str, int] = {}
    for case in suites.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        elif (skip := case.find("skipped")) is not None:
            counts["skipped"] += 1
            reason = skip.get("message", "").removeprefix("Skipped: ")
            reasons[reason] = reasons.get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return {**counts, "skip_reasons": reasons}


def certificate_errors(path: Path) -> list[dict[str, Any]]:
    """Each update's measured errors, read from a certificate this check just made (for display: the gate, not
    this summary, is what verifies a certificate)."""
    from mixle_parallel.verification.attestation import load_certificate, read_unverified

    certificate = read_unverified(load_certificate(path))
    return [{"update": e.node_id, "max_abs": e.maximum_absolute_error, "max_rel": e.maximum_relative_error,
             "tolerance": {"atol": e.tolerance.atol, "rtol": e.tolerance.rtol, "bitwise": e.tolerance.bitwise},
             "deterministic": e.deterministic, "samples": e.sample_count,
             "device": certificate.device_kind, "comm_backend": certificate.comm_backend}
            for e in certificate.evidence]


def summary_table(parts: dict[str, dict[str, Any]]) -> str:
    """The closing table, as Markdown (printed and written to summary.md)."""
    env = parts.get("environment", {})
    device = ", ".join(env.get("devices", [])) or "no CUDA device"
    lines = [f"# device check: {device} (torch {env.get('torch')}, CUDA {env.get('cuda_version')})", "",
             "| part | status | seconds | figures |", "| --- | --- | --- | --- |"]
    for name in ("environment", "tests", "em", "bf16", "in_situ"):
        part = parts.get(name, {})
        status, seconds = part.get("status", "not run"), part.get("seconds", "-")
        lines.append(f"| {name} | {status} | {seconds} | {_figures(name, part)} |")
    reasons = parts.get("tests", {}).get("skip_reasons") or {}
    if reasons:
        lines += ["", "Skipped device tests, by reason:", ""]
        lines += [f"- {count} x {reason}" for reason, count in sorted(reasons.items())]
    em = parts.get("em", {})
    if em.get("results"):
        lines += ["", f"EM, {em['rows']:,} x {em['dims']}-D diag K={em['k']} ({em['device']}):", "",
                  "| library | status | wall s | iterations | converged | mean ll/row |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in em["results"]:
            lines.append(f"| {r['library']} | {r['status']} | {r['wall_s']:.2f} | {r['iterations']} | "
                         f"{'yes' if r['converged'] else 'no'} | {r['mean_ll']:.6f} |")
    return "\n".join(lines) + "\n"


def _figures(name: str, part: dict[str, Any]) -> str:
    if name == "tests" and "passed" in part:
        return f"{part['passed']} passed, {part['failed']} failed, {part['skipped']} skipped"
    if name == "bf16" and part.get("evidence"):
        return "; ".join(f"{e['update']}: abs {e['max_abs']:.2e} rel {e['max_rel']:.2e}" for e in part["evidence"])
    if name == "in_situ" and "admission" in part:
        return f"admission {part['admission']} on {part.get('device')} (prepare {part.get('prepare_s', 0):.1f} s)"
    if name == "environment":
        return str(part.get("nvidia_smi", part.get("error", "")))
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", help="folder the results are written to (created)")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="without CUDA, run the GPU parts on the CPU at a small size (tests this script)")
    parser.add_argument("--em-rows", type=int, default=None, help="rows of the EM comparison (default 10M on a GPU)")
    parser.add_argument("--em-budget-s", type=float, default=50.0, help="wall-clock budget of each EM fit")
    parser.add_argument("--parts", default="environment,tests,em,bf16,in_situ", help="comma-separated parts to run")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, cpu_dry_run=args.cpu_dry_run, em_rows=args.em_rows, em_budget_s=args.em_budget_s)
    chosen = set(args.parts.split(","))
    unknown = chosen - set(PART_LIMITS_S)
    if unknown:
        parser.error(f"unknown --parts {sorted(unknown)}: choose from {', '.join(PART_LIMITS_S)}")
    cuda = bool(check.environment().get("cuda"))
    print(f"[device-check] CUDA: {'yes' if cuda else 'no'}; writing to {out}", flush=True)
    for name in ("tests", "em", "bf16", "in_situ"):
        if name not in chosen:
            continue
        print(f"[device-check] {name} ...", flush=True)
        check.parts.setdefault(name, {})
        try:
            check.tests() if name == "tests" else getattr(check, name)(cuda)
        except Exception as exc:  # noqa: BLE001 - a broken part is reported; the check runs to the end
            check.parts[name]["status"] = f"failed ({type(exc).__name__}: {exc})"
        print(f"[device-check] {name}: {check.parts[name].get('status')}", flush=True)
    (out / "summary.json").write_text(json.dumps(check.parts, indent=1, default=str), encoding="utf-8")
    table = summary_table(check.parts)
    (out / "summary.md").write_text(table, encoding="utf-8")
    print(table)
    return 0  # a failed part is in the summary; the check itself ran to the end


if __name__ == "__main__":
    raise SystemExit(main())
