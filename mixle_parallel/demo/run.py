"""``mixle-parallel demo``: the main job, end to end on a local CPU mesh, with no arguments.

1. certify torch_native for dp_shard=2 x tp=2 (4 gloo ranks against the single-process reference);
2. train a small transformer LM for 50 steps on a built-in synthetic corpus under that certificate,
   with SDC audit replays on, receipts and a hash-chained ledger written by the logging rank;
3. certify EM on the mp backend (2 workers, bitwise statistics) and fit a Gaussian mixture with
   chunk audits under that certificate;
4. audit the ledger it wrote; the final checkpoint and the fitted model carry signed provenance statements;
5. check the whole folder with verify-run, draw it into report.html, print a summary and a legend of what it
   wrote, and where.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.demo.train import audit_counts

TORCH_SPEC = "mixle_parallel.executors.torch.harness_adapter:VerifiableTorchNative"
TRAIN_PLAN = ParallelPlan(dp_shard=2, tp=2)
EM_WORKERS = 2
TRAIN_TIMEOUT_S = 900.0
"""The training phase as a whole (start, rendezvous, every step) on a loaded 2-core machine."""
LEGEND: tuple[tuple[str, str], ...] = (
    ("certificate-torch_native.json", "admission certificate for torch_native on dp_shard=2 x tp=2 at fp32: the "
                                      "measured evidence of every update, signed by your key"),
    ("certificate-em_mp.json", "the same for EM on the mp backend (2 worker processes, fp64): bitwise the fixed "
                               "fold order and one worker, within 1e-9 of the one-piece reference"),
    ("receipts.jsonl", "one StepReceipt per training step (JSON Lines, from rank 0): loss, global example and token "
                       "counts, bytes moved, the step's audit records, the certificate id"),
    ("ledger.jsonl", "the ledger of both runs (training, then EM): a run start, a receipt per training step or EM "
                     "iteration, the audit records, a run end with a signed seal; each entry hash-chained to the one "
                     "before"),
    ("ledger.jsonl.head", "the ledger's signed head (entry count, last hash): a later audit proves the ledger only "
                          "grew since"),
    ("summary.json", "the final table's figures, as JSON"),
    ("checkpoints/", "the trained LM's final checkpoint (a signed generation: manifest, tensors, state) and its "
                     "provenance gen-00000001.intoto.json beside it"),
    ("em-model/", "the fitted mixture (model.json)"),
    ("em-model.intoto.json", "its provenance: an in-toto statement (SLSA provenance) listing the model's files and "
                             "sha256, binding the run, certificate, ledger head, data digest and audit summary, "
                             "signed by your key"),
    ("report.html", "the run drawn for a person: loss, step time per rank, audits and findings, EM log-likelihood, "
                    "the certificates, the verify-run verdict; open it in any browser, it needs no network"),
)
"""What the demo writes into its run folder, each with a line saying what it is (printed at the end, in --help
and in README.md)."""
OUTPUTS = tuple(name for name, _ in LEGEND)
STORE = ("the signing key made on first use (signing-key.pem, signing-key.pub, trust.json) and a copy of each "
         "certificate (certificates/<id>.json), where later runs find them")
"""What the demo writes outside the run folder, into the trust store."""
STORE_WHERE = "$MIXLE_PARALLEL_HOME, else $XDG_CONFIG_HOME/mixle-parallel, else ~/.config/mixle-parallel"
TERMS: tuple[tuple[str, str], ...] = (
    ("audits", "training steps and EM chunks recomputed and compared with the original: bitwise where the "
               "recomputation adds in the same order (another rank's replay, EM's reference), within a stated bound "
               "where it cannot (tensor parallelism's reference, whose sums run in another order); the table says "
               "how many of each, and the largest bound"),
    ("findings", "audits that did not match: a faulty device or a software defect (a healthy run shows 0)"),
)
CLI_ENV = "MIXLE_PARALLEL_CLI"
"""How the user runs the CLI, for the commands the demo prints (``scripts/dev`` sets ``scripts/dev run``)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mixle-parallel demo", description=(__doc__ or "").replace("``", ""),
                                     epilog=_where_it_lands(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="mixle-parallel-run",
                        help="run folder for the files listed below (default ./mixle-parallel-run)")
    parser.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    parser.add_argument("--em-rows", type=int, default=200_000, help="rows of the EM data (default 200000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, model and audits (default 0)")
    return parser


def _where_it_lands() -> str:
    """The --help epilog: every file of the run folder, then what goes to the trust store."""
    width = max(len(name) for name, _ in LEGEND)
    lines = ["Written into --out (earlier demo files there are replaced):"]
    lines += [textwrap.fill(text, 110, initial_indent=f"  {name:<{width}}  ", subsequent_indent=" " * (width + 4))
              for name, text in LEGEND]
    lines += ["", textwrap.fill(f"Written into your trust store ({STORE_WHERE}): {STORE}.", 110), ""]
    lines += [textwrap.fill(f"{term}: {text}.", 110) for term, text in TERMS]
    return "\n".join(lines)


def cli_prefix(environ: Mapping[str, str]) -> str:
    """How the user runs the CLI: ``$MIXLE_PARALLEL_CLI`` (``scripts/dev run``), else ``mixle-parallel``."""
    return environ.get(CLI_ENV, "").strip() or "mixle-parallel"


def legend(out: Path, environ: Mapping[str, str], cwd: Path) -> Table:
    """What the demo wrote and where, and what audits and findings are."""
    table = Table(title=f"what the demo wrote into {_shown(out, cwd)}/", title_justify="left", show_header=False,
                  box=None)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for name, text in LEGEND:
        table.add_row(name, text)
    table.add_row("", "")
    table.add_row("trust store", f"{_store_home(environ)}: {STORE}")
    for term, text in TERMS:
        table.add_row(term, text)
    return table


def recheck_command(out: Path, environ: Mapping[str, str], cwd: Path) -> str:
    """The command that re-checks the demo's ledger, in the form the user runs the CLI."""
    return f"{cli_prefix(environ)} audit {_shown(out, cwd) / 'ledger.jsonl'}"


def _shown(out: Path, cwd: Path) -> Path:
    return out.relative_to(cwd) if out.is_relative_to(cwd) else out


def _store_home(environ: Mapping[str, str]) -> Path:
    from mixle_parallel.verification.keys import config_home

    return config_home(environ)


def _fresh_run_folder(out: Path) -> None:
    """Create ``out`` and remove only the files and folders an earlier demo wrote there (a ledger is one run's)."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    for name in OUTPUTS:
        if name.endswith("/"):
            shutil.rmtree(out / name, ignore_errors=True)
        else:
            (out / name).unlink(missing_ok=True)


def _evidence_table(title: str, report: Any) -> Table:
    table = Table(title=title)
    for column in ("update", "max abs err", "max rel err", "deterministic", "collectives", "samples"):
        table.add_column(column, justify="left" if column == "update" else "right")
    for e in report.evidence:
        table.add_row(e.node_id, f"{e.maximum_absolute_error:.2e}", f"{e.maximum_relative_error:.2e}",
                      "yes" if e.deterministic else "NO", "match" if e.collectives_match else "MISMATCH",
                      str(e.sample_count))
    return table


def describe_audits(counts: Mapping[str, Any]) -> str:
    """``"8 audits (4 bitwise, 4 within 8.85e-05), 0 findings"``: how each audit was compared (``audit_counts``)."""
    if counts["within_bound"] == 0:
        how = "all bitwise" if counts["audits"] else "none drawn"
    else:
        how = f"{counts['bitwise']} bitwise, {counts['within_bound']} within {counts['max_bound']:.3g}"
    return f"{counts['audits']} audits ({how}), {counts['findings']} findings"


PLAIN_PROGRESS_EVERY = 10
"""Without a terminal (a log, a pipe) a phase prints a plain progress line every this many steps or seconds."""


def _plain_progress(console: Console, unit: str, done: int, total: int, detail: str) -> None:
    """A plain line of progress where no live bar can be drawn: every ``PLAIN_PROGRESS_EVERY``-th step."""
    if not console.is_terminal and (done % PLAIN_PROGRESS_EVERY == 0 or done == 1):
        console.print(f"  {unit} {done}/{total}, {detail}", markup=False, highlight=False)


@contextlib.contextmanager
def _ticker(console: Console, label: str) -> Iterator[None]:
    """Where no spinner can be drawn, a line every ``PLAIN_PROGRESS_EVERY`` seconds that ``label`` is still
    running (the harness reports nothing until its table)."""
    done = threading.Event()

    def tick() -> None:
        started = time.monotonic()
        while not done.wait(PLAIN_PROGRESS_EVERY):
            console.print(f"  {label}: {time.monotonic() - started:.0f} s", markup=False, highlight=False)

    thread = threading.Thread(target=tick, daemon=True) if not console.is_terminal else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread is not None:
            thread.join()


def _phase(console: Console, number: int, text: str) -> None:
    """Announce a phase before it starts, so a log shows what is running."""
    console.print(f"[bold][{number}/4][/bold] {text}", highlight=False)


def _certify(console: Console, label: str, target: Any, plan: ParallelPlan, precision: str, workload: Any,
             seed: int, path: Path) -> Any:
    from mixle_parallel.verification import open_envelope, save_certificate, verify

    with console.status(f"certifying {label} on {plan.describe()} at {precision} (real processes vs reference)"), \
            _ticker(console, f"certifying {label}"):
        report = verify(target, plan, precision=precision, workload=workload, trials=1, seed=seed)
    console.print(_evidence_table(f"evidence: {label}", report))
    if not report.passed:
        raise RuntimeError(f"{label} failed verification: {'; '.join(report.failures)}")
    envelope = report.certify(target)
    save_certificate(envelope, path)
    certificate, keyid = open_envelope(envelope)
    console.print(f"[green]certified[/green] {label}: {certificate.certificate_id[:23]}..., signed by key "
                  f"{keyid[:16]}... -> {path}")
    return Certified(envelope, _how_compared(report))


@attrs.frozen
class Certified:
    """A phase's certificate and how its evidence was compared (for the summary table)."""

    envelope: Any
    tolerance: str


def _how_compared(report: Any) -> str:
    """How the certificate's evidence was compared with the reference: bitwise, or within which bound."""
    notes = " ".join(note for e in report.evidence for note in e.notes)
    tolerances = {(e.tolerance.atol, e.tolerance.rtol) for e in report.evidence if not e.tolerance.bitwise}
    within = ", ".join(f"atol {a:.0e} rtol {r:.0e}" for a, r in sorted(tolerances))
    reference = f"within {within} of the reference" if within else "bitwise the reference"
    return f"{reference}{'; bitwise across worker counts' if 'bitwise equal' in notes else ''}"


def _train(console: Console, out: Path, steps: int, seed: int) -> dict[str, Any]:
    from mixle_parallel.demo.train import train_rank
    from mixle_parallel.verification.harness.mesh import run_world

    config = {"plan": {"dp_shard": TRAIN_PLAN.dp_shard, "tp": TRAIN_PLAN.tp}, "steps": steps, "seed": seed,
              "certificate": str(out / "certificate-torch_native.json"), "ledger": str(out / "ledger.jsonl"),
              "checkpoints": str(out / "checkpoints"),
              "receipts": str(out / "receipts.jsonl"), "session_options": {"audit_rate": 0.05}}
    with Progress(TextColumn("training tiny LM on {task.fields[plan]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("train", total=steps, plan=TRAIN_PLAN.describe(), loss="-")

        def on_step(rank: int, message: tuple[int, float]) -> None:
            progress.update(task, completed=message[0], loss=f"{message[1]:.3f}")
            _plain_progress(console, "step", message[0], steps, f"loss {message[1]:.3f}")

        ranks = run_world(train_rank, TRAIN_PLAN.world_size, config, timeout=TRAIN_TIMEOUT_S,
                          group_timeout_s=300.0, on_message=on_step)
    return ranks[0]


def _em_data(rows: int, seed: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(seed)
    means, scales = np.array([-6.0, -1.5, 2.0, 7.0]), np.array([1.0, 0.6, 0.8, 1.5])
    labels = rng.integers(0, 4, size=rows)
    return rng.normal(means[labels], scales[labels])


def _fit_em(console: Console, out: Path, certificate: Any, rows: int, seed: int) -> dict[str, Any]:
    from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, fit
    from mixle_parallel.verification import Ledger

    data = _em_data(rows, seed)
    max_its = 40
    history: list[float] = []
    ledger = Ledger(out / "ledger.jsonl")
    with Progress(TextColumn("EM on mp x{task.fields[workers]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("log-lik {task.fields[ll]}"), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("em", total=max_its, workers=EM_WORKERS, ll="-")

        def on_step(step: Any) -> None:
            history.append(float(step.log_likelihood))
            progress.update(task, completed=len(history), ll=f"{step.log_likelihood:.1f}")
            _plain_progress(console, "iteration", len(history), max_its, f"log-lik {step.log_likelihood:.1f}")

        result = fit(data, MixtureEstimator([GaussianEstimator()] * 4), max_its=max_its, delta=1e-6, seed=seed,
                     backend="mp", num_workers=EM_WORKERS, on_step=on_step, progress=False, admission=certificate,
                     audit_rate=0.05, ledger=ledger)
        progress.update(task, total=len(history), completed=len(history))
    from mixle_parallel.executors.estimation.model_file import save_model

    save_model(result.model, out / "em-model", ledger=ledger.path, data=data)  # with its provenance beside it
    return {"iterations": result.iterations, "log_likelihood": result.log_likelihood,
            **audit_counts(result.audit_records), "admission": result.admission,
            "quarantined": list(result.quarantined)}


def run_demo(argv: Sequence[str], console: Console) -> int:
    """Run the main job; exit 0 when certification, training, EM and the ledger audit all pass."""
    args = _parser().parse_args(list(argv))
    console = Console(width=max(console.width, 110)) if not console.is_terminal else console
    try:
        return _run(args, console)
    except (RuntimeError, ValueError) as exc:
        console.print(f"[red]demo failed:[/red] {exc}")
        return 1


def _summary_table(out: Path, timings: Mapping[str, float], phases: tuple[Certified, dict[str, Any], Certified,
                   dict[str, Any]], report: Any) -> Table:
    """The closing table: each phase's result (how its evidence or audits were compared) and seconds."""
    torch_report, training, em_report, em = phases
    summary = Table(title=f"mixle-parallel demo: {out}")
    summary.add_column("phase")
    summary.add_column("result")
    summary.add_column("seconds", justify="right")
    summary.add_row("certify torch_native", f"{TRAIN_PLAN.describe()}, fp32, {torch_report.tolerance}",
                    f"{timings['certify torch_native']:.1f}")
    summary.add_row("train tiny LM", f"{training['steps']} steps, loss {training['first_loss']:.3f} -> "
                    f"{training['last_loss']:.3f}, {describe_audits(training)}", f"{timings['train']:.1f}")
    summary.add_row("certify EM on mp", f"dp_replicate={EM_WORKERS}, fp64, {em_report.tolerance}",
                    f"{timings['certify em_mp']:.1f}")
    summary.add_row("fit mixture", f"{em['iterations']} iterations, log-lik {em['log_likelihood']:.1f}, "
                    f"{describe_audits(em)}", f"{timings['fit EM']:.1f}")
    verdict = "[green]ok[/green]" if report.ok else f"[red]{len(report.faults)} faults[/red]: {report.faults[0]}"
    summary.add_row("audit ledger", f"{verdict} ({report.entries} entries, {report.runs} runs, "
                    f"{report.receipts} receipts, {report.audits} audits); {report.signed_head or 'no signed head'}",
                    "")
    summary.add_row("total", "", f"{timings['total']:.1f}")
    return summary


def _run(args: argparse.Namespace, console: Console) -> int:
    """The four phases and the summary (see the module docstring)."""
    from mixle_parallel.demo.train import demo_workload
    from mixle_parallel.executors.estimation.admission.harness_adapter import VerifiableEncodedData
    from mixle_parallel.verification import verify_ledger

    out = Path(args.out).resolve()
    _fresh_run_folder(out)
    started = time.monotonic()
    timings: dict[str, float] = {}

    t = time.monotonic()
    _phase(console, 1, f"certify torch_native on {TRAIN_PLAN.describe()}: {TRAIN_PLAN.world_size} gloo ranks, every "
                       "update against a single-process reference (the longest phase: tens of seconds)")
    torch_report = _certify(console, "torch_native", TORCH_SPEC, TRAIN_PLAN, "fp32", demo_workload(2), args.seed,
                            out / "certificate-torch_native.json")
    timings["certify torch_native"] = time.monotonic() - t

    t = time.monotonic()
    _phase(console, 2, f"train a tiny LM for {args.steps} steps under that certificate, with audits")
    training = _train(console, out, args.steps, args.seed)
    timings["train"] = time.monotonic() - t

    t = time.monotonic()
    _phase(console, 3, f"certify EM on mp ({EM_WORKERS} worker processes) against the fixed fold order")
    em_report = _certify(console, "EM on mp", VerifiableEncodedData("mp"), ParallelPlan(dp_replicate=EM_WORKERS),
                         "fp64", "gaussian_mixture", args.seed, out / "certificate-em_mp.json")
    timings["certify em_mp"] = time.monotonic() - t

    t = time.monotonic()
    _phase(console, 4, f"fit a 4-component Gaussian mixture on {args.em_rows} rows under that certificate")
    em = _fit_em(console, out, em_report.envelope, args.em_rows, args.seed)
    timings["fit EM"] = time.monotonic() - t

    report = verify_ledger(out / "ledger.jsonl")
    timings["total"] = time.monotonic() - started

    summary = _summary_table(out, timings, (torch_report, training, em_report, em), report)
    console.print(summary)
    (out / "summary.json").write_text(json.dumps({"training": training, "em": em, "timings": timings,
                                                  "ledger_ok": report.ok, "signed_head": report.signed_head},
                                                 indent=2, sort_keys=True))
    checked = _verify_and_report(console, out)
    console.print(legend(out, os.environ, Path.cwd()))
    console.print(f"re-check the ledger any time: {recheck_command(out, os.environ, Path.cwd())}",
                  soft_wrap=True, markup=False, highlight=False)  # never cropped or folded: it is to be copied
    return 0 if report.ok and checked else 1


def _verify_and_report(console: Console, out: Path) -> bool:
    """The closing evidence: verify-run over the whole folder (certificates, ledger, checkpoint, provenance and
    their agreement), then report.html; True when verify-run passes."""
    from mixle_parallel.run_report import write_report

    verdict = write_report(out, out / "report.html")
    word = "[green]verified[/green]" if verdict.ok else f"[red]FAILED[/red]: {verdict.failures[0].detail}"
    console.print(f"verify-run {_shown(out, Path.cwd())}: {word} ({len(verdict.checks)} checks); "
                  f"report: {_shown(out, Path.cwd()) / 'report.html'}")
    shown = _shown(out, Path.cwd())
    console.print(f"verify the whole run folder any time: {cli_prefix(os.environ)} verify-run {shown}",
                  soft_wrap=True, markup=False, highlight=False)  # never cropped or folded: it is to be copied
    return verdict.ok


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m mixle_parallel.demo.run``."""
    import sys

    return run_demo(sys.argv[1:] if argv is None else argv, Console())


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
