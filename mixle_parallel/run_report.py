"""``mixle-parallel report RUN_DIR -o report.html``: one self-contained HTML page that draws a run for a person.

Read from the run folder's ledgers (their signed heads verified first, by ``verify-run``) and
certificates: the loss per training step; the step time per rank (``rank_step_s`` of each receipt's
health record, else the time between rank 0's receipts); the audit timeline (each audited step or
chunk by rank, findings coloured by cause); the EM log-likelihood per iteration; a summary of each
certificate (executor, plan, precision, tolerance, in situ or not); and the ``verify-run`` verdict.
The plots are inline SVG drawn here (no script, no network, no CDN): the file opens anywhere,
offline. Every figure carries ``data-plot`` and ``data-points`` so a test can find it.
"""

from __future__ import annotations

import argparse
import html
import math
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs

from mixle_parallel.run_verification import RunVerdict, verify_run
from mixle_parallel.verification.attestation import load_certificate, read_unverified
from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.ledger import head_path, iter_ledger

__all__ = ["RunSeries", "collect", "main_report", "render", "write_report"]

_W, _H, _PAD = 600, 260, 48
_LEFT = 72
"""Room left of the y axis for its tick labels (a log-likelihood of -53,750 is six characters)."""
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
_CAUSE_COLOURS = {"device": "#d62728", "backend_defect": "#bcbd22", "unattributed": "#ff7f0e"}


@attrs.define
class RunSeries:
    """What the report draws, read from a run folder."""

    loss: list[tuple[float, float]] = attrs.field(factory=list)
    step_seconds: dict[str, list[tuple[float, float]]] = attrs.field(factory=dict)
    audits: list[dict[str, Any]] = attrs.field(factory=list)
    em_log_likelihood: dict[str, list[tuple[float, float]]] = attrs.field(factory=dict)
    """One series per EM fit in the ledgers (``fit 1``, ``fit 2``, ...)."""
    certificates: list[dict[str, str]] = attrs.field(factory=list)


def _data(document: Any) -> Mapping[str, Any]:
    inner = document.get("data", document) if isinstance(document, Mapping) else {}
    return inner if isinstance(inner, Mapping) else {}


def _time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return None


def _read_ledger(path: Path, series: RunSeries) -> None:
    last_time: float | None = None
    for line in iter_ledger(path, raw=True):
        entry = line.entry
        if entry is None:
            continue
        if entry.kind == "run_start":
            last_time = None
            continue
        if entry.kind == "audit":
            record = _data(entry.payload.get("record"))
            series.audits.append({"step": record.get("step", 0), "rank": record.get("rank", 0),
                                  "family": record.get("family", ""), "matched": record.get("matched", True),
                                  "cause": record.get("cause") or ("" if record.get("matched", True)
                                                                   else "unattributed"),
                                  "unit": record.get("unit", "")})
            continue
        if entry.kind != "receipt":
            continue
        receipt = _data(entry.payload.get("receipt"))
        extra = receipt.get("extra") or {}
        step = float(receipt.get("step", 0))
        if extra.get("kind") == "em_iteration":
            if step == 0 or not series.em_log_likelihood:
                series.em_log_likelihood[f"fit {len(series.em_log_likelihood) + 1}"] = []
            value = extra.get("log_likelihood")
            if isinstance(value, (int, float)) and math.isfinite(value):
                series.em_log_likelihood[f"fit {len(series.em_log_likelihood)}"].append((step, float(value)))
            continue
        loss = receipt.get("loss")
        if isinstance(loss, (int, float)) and math.isfinite(loss) and not receipt.get("skipped"):
            series.loss.append((step, float(loss)))
        ranks = (extra.get("health") or {}).get("rank_step_s") if isinstance(extra.get("health"), Mapping) else None
        now = _time(entry.time)
        if isinstance(ranks, Sequence) and ranks:
            for rank, seconds in enumerate(ranks):
                series.step_seconds.setdefault(f"rank {rank}", []).append((step, float(seconds)))
        elif now is not None and last_time is not None:
            series.step_seconds.setdefault("rank 0 (ledger times)", []).append((step, now - last_time))
        last_time = now


def collect(run_dir: str | Path) -> RunSeries:
    """The series of every ledger (a ``*.jsonl`` with a signed head) and the certificates in ``run_dir``."""
    folder = Path(run_dir)
    series = RunSeries()
    for path in sorted(folder.rglob("*.jsonl")):
        if head_path(path).exists():
            _read_ledger(path, series)
    for path in sorted(folder.glob("certificate*.json")):
        try:
            cert = read_unverified(load_certificate(path))
        except (ValueError, OSError) as exc:
            series.certificates.append({"file": path.name, "problem": str(exc)})
            continue
        tol = cert.tolerance
        series.certificates.append({
            "file": path.name, "executor": f"{cert.executor} {cert.executor_version}",
            "plan": cert.measured_plan.describe(), "precision": cert.precision,
            "tolerance": "bitwise" if tol.bitwise else f"atol={tol.atol:.3g} rtol={tol.rtol:.3g}",
            "in situ": "yes" if cert.measurement is not None else "no (harness)",
            "device": f"{cert.device_kind}/{cert.comm_backend}", "issued": cert.issued_at,
            "certificate id": cert.certificate_id[:23] + "..."})
    return series


# ---- drawing ------------------------------------------------------------------------------------------
def _ticks(lo: float, hi: float, *, integer: bool = False) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / 4))
    for factor in (1, 2, 5, 10):
        if (hi - lo) / (step * factor) <= 6:
            step *= factor
            break
    step = max(step, 1.0) if integer else step
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _axes(xs: Sequence[float], ys: Sequence[float]) -> tuple[Any, Any, list[str]]:
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0) * 0.1 - 1e-9, y1 + abs(y1) * 0.1 + 1e-9

    def sx(x: float) -> float:
        return _LEFT + (x - x0) / (x1 - x0) * (_W - _LEFT - _PAD / 2)

    def sy(y: float) -> float:
        return _H - _PAD + -(y - y0) / (y1 - y0) * (_H - 2.2 * _PAD)

    parts = [f'<line x1="{_LEFT}" y1="{_H - _PAD}" x2="{_W - _PAD / 2}" y2="{_H - _PAD}" stroke="#333"/>',
             f'<line x1="{_LEFT}" y1="{_PAD * 1.1}" x2="{_LEFT}" y2="{_H - _PAD}" stroke="#333"/>']
    for t in _ticks(x0, x1, integer=all(float(x).is_integer() for x in xs)):
        parts.append(f'<text x="{sx(t):.1f}" y="{_H - _PAD + 14}" font-size="10" text-anchor="middle">{t:g}</text>')
    for t in _ticks(y0, y1, integer=all(float(y).is_integer() for y in ys)):
        parts.append(f'<text x="{_LEFT - 4}" y="{sy(t) + 3:.1f}" font-size="10" text-anchor="end">{t:.6g}</text>')
        parts.append(f'<line x1="{_LEFT}" y1="{sy(t):.1f}" x2="{_W - _PAD / 2}" y2="{sy(t):.1f}" stroke="#eee"/>')
    return sx, sy, parts


def _figure(plot: str, title: str, points: int, svg: str, caption: str = "") -> str:
    return (f'<figure class="plot" data-plot="{plot}" data-points="{points}"><figcaption>{html.escape(title)}'
            f'</figcaption>{svg}{f"<p class=note>{html.escape(caption)}</p>" if caption else ""}</figure>')


def _empty(plot: str, title: str, why: str) -> str:
    return (f'<figure class="plot empty" data-plot="{plot}" data-points="0"><figcaption>{html.escape(title)}'
            f'</figcaption><p class=note>{html.escape(why)}</p></figure>')


def line_chart(plot: str, title: str, series: Mapping[str, Sequence[tuple[float, float]]], xlabel: str,
               ylabel: str) -> str:
    """An SVG line chart of named (x, y) series, one colour each, with a point marker per value."""
    values = [p for s in series.values() for p in s]
    if not values:
        return _empty(plot, title, "no data in this run folder")
    sx, sy, parts = _axes([p[0] for p in values], [p[1] for p in values])
    for index, (name, points) in enumerate(series.items()):
        colour = _COLOURS[index % len(_COLOURS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>')
        parts += [f'<circle class="point" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.2" fill="{colour}">'
                  f'<title>{html.escape(name)}: {xlabel} {x:g}, {y:.6g}</title></circle>' for x, y in points]
        parts.append(f'<text x="{_W - _PAD / 2}" y="{14 + 13 * index}" font-size="11" fill="{colour}" '
                     f'text-anchor="end">{html.escape(name)}</text>')
    parts.append(f'<text x="{_W / 2}" y="{_H - 8}" font-size="11" text-anchor="middle">{html.escape(xlabel)}</text>')
    parts.append(f'<text x="12" y="{_H / 2}" font-size="11" text-anchor="middle" transform="rotate(-90 12 {_H / 2})">'
                 f'{html.escape(ylabel)}</text>')
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" role="img">{"".join(parts)}</svg>'
    return _figure(plot, title, len(values), svg)


def audit_timeline(audits: Sequence[Mapping[str, Any]]) -> str:
    """Each audit as a dot at (step or iteration, rank): green when it matched, coloured by cause when not."""
    title = "audit timeline: audited steps and chunks by rank; findings by cause"
    if not audits:
        return _empty("audits", title, "no audit records in this run folder")
    sx, sy, parts = _axes([float(a["step"]) for a in audits], [float(a["rank"]) for a in audits])
    causes: dict[str, int] = {}
    for a in audits:
        finding = not a["matched"]
        colour = _CAUSE_COLOURS.get(a["cause"], "#d62728") if finding else "#2ca02c"
        if finding:
            causes[a["cause"]] = causes.get(a["cause"], 0) + 1
        x, y, r = sx(float(a["step"])), sy(float(a["rank"])), 5 if finding else 3.5
        tip = (f'<title>{html.escape(str(a["family"]))} step {a["step"]} rank {a["rank"]} '
               f'{html.escape(str(a["unit"]))}: {"FINDING " + a["cause"] if finding else "matched"}</title>')
        mark = "point finding" if finding else "point"
        if a["family"] == "em":  # an EM chunk: a square; a training step: a dot
            parts.append(f'<rect class="{mark}" x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r}" height="{2 * r}" '
                         f'fill="{colour}" opacity="0.8">{tip}</rect>')
        else:
            parts.append(f'<circle class="{mark}" cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colour}" '
                         f'opacity="0.8">{tip}</circle>')
    legend = [("● training step  ■ EM chunk; matched", "#2ca02c", len(audits) - sum(causes.values()))]
    legend += [(f"finding: {c}", _CAUSE_COLOURS.get(c, "#d62728"), n) for c, n in sorted(causes.items())]
    for index, (label, colour, count) in enumerate(legend):
        parts.append(f'<text x="{_W - _PAD / 2}" y="{14 + 13 * index}" font-size="11" fill="{colour}" '
                     f'text-anchor="end">{html.escape(label)}: {count}</text>')
    parts.append(f'<text x="{_W / 2}" y="{_H - 8}" font-size="11" text-anchor="middle">step / iteration</text>')
    parts.append(f'<text x="12" y="{_H / 2}" font-size="11" text-anchor="middle" transform="rotate(-90 12 {_H / 2})">'
                 'rank</text>')
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" role="img">{"".join(parts)}</svg>'
    return _figure("audits", title, len(audits), svg,
                   f"{len(audits)} audits, {sum(causes.values())} findings "
                   f"({', '.join(f'{c}: {n}' for c, n in sorted(causes.items())) or 'none'})")


def _table(plot: str, title: str, rows: Sequence[Mapping[str, str]]) -> str:
    if not rows:
        return _empty(plot, title, "no certificate in this run folder")
    columns = list(dict.fromkeys(k for row in rows for k in row))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr class=point>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in columns)
                   + "</tr>" for r in rows)
    return (f'<figure class="plot" data-plot="{plot}" data-points="{len(rows)}"><figcaption>{html.escape(title)}'
            f'</figcaption><table><tr>{head}</tr>{body}</table></figure>')


def _verdict(verdict: RunVerdict) -> str:
    rows = [{"check": c.check, "target": c.target, "verdict": "ok" if c.ok else "FAIL", "detail": c.detail}
            for c in verdict.checks]
    rows += [{"check": "context", "target": n, "verdict": "unsigned", "detail": "not covered by a signature"}
             for n in verdict.unsigned]
    word = "VERIFIED" if verdict.ok else "FAILED"
    table = _table("verdict", f"verify-run verdict: {word}", rows)
    return table.replace('<figure class="plot"', f'<figure class="plot {word.lower()}"', 1)


_STYLE = """body{font-family:sans-serif;margin:24px;color:#222;max-width:1340px}
.grid{display:flex;flex-wrap:wrap;gap:16px}figure{margin:0;border:1px solid #ddd;padding:8px;background:#fff}
figcaption{font-weight:bold;margin-bottom:6px}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}.note{font-size:12px;color:#555}
.verified figcaption{color:#2ca02c}.failed figcaption{color:#d62728}figure.empty{min-width:300px}"""


def render(run_dir: str | Path, verdict: RunVerdict, series: RunSeries | None = None) -> str:
    """The report page for ``run_dir`` (one string of HTML, no external reference)."""
    data = series or collect(run_dir)
    figures = [
        line_chart("loss", "training loss per step", {"loss": data.loss}, "step", "loss"),
        line_chart("step_time", "step time per rank (seconds)", data.step_seconds, "step", "seconds"),
        audit_timeline(data.audits),
        line_chart("em_loglik", "EM log-likelihood per iteration", data.em_log_likelihood, "iteration",
                   "log-likelihood"),
        _table("certificates", "certificates: executor, plan, precision, tolerance, in situ", data.certificates),
        _verdict(verdict),
    ]
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>mixle-parallel run report</title>"
            f"<style>{_STYLE}</style></head><body><h1>mixle-parallel run report</h1>"
            f"<p class=note>{html.escape(str(Path(run_dir).resolve()))}</p><div class=grid>{''.join(figures)}</div>"
            "</body></html>\n")


def write_report(run_dir: str | Path, out: str | Path, *, trust_store: TrustStore | None = None) -> RunVerdict:
    """Verify ``run_dir`` (``verify_run``), then write its report to ``out``; returns the verdict."""
    verdict = verify_run(run_dir, trust_store=trust_store)
    Path(out).write_text(render(run_dir, verdict), encoding="utf-8")
    return verdict


def main_report(argv: Sequence[str] | None = None) -> int:
    """``mixle-parallel report RUN_DIR -o report.html``: exit 0 when written (the verdict is in the page)."""
    parser = argparse.ArgumentParser(prog="mixle-parallel report",
                                     description=(__doc__ or "").split("\n")[0].replace("``", ""))
    parser.add_argument("run_dir", help="the run folder (e.g. what `mixle-parallel demo` wrote)")
    parser.add_argument("-o", "--out", default="report.html", help="the HTML file to write (default report.html)")
    parser.add_argument("--trust-store", metavar="DIR", help="trust store for the verdict (default: yours)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if not Path(args.run_dir).is_dir():
        print(f"mixle-parallel report: no run folder at {args.run_dir!r}", file=sys.stderr)
        return 2
    verdict = write_report(args.run_dir, args.out, trust_store=TrustStore(args.trust_store) if args.trust_store
                           else None)
    print(f"wrote {args.out} (verify-run: {'ok' if verdict.ok else 'FAILED'}); open it in any browser")
    return 0
