"""Ledger audit cost against ledger size: wall time and peak memory of ``mixle-parallel audit``, side by side.

    python benchmarks/ledger_audit.py [--sizes 10000 100000 1000000] [--runs 10]

For each size a ledger of that many entries (``--runs`` runs of rank-0 receipts, each closed by a
signed run_end seal, with the signed head) is written straight to a temporary file, then audited by
``verify_ledger`` in a fresh Python process (one per size, so each peak RSS is its own). The table
gives entries, audit seconds, peak resident MB of the auditing process, and both as ratios to the
smallest size: streaming means time grows with the entries and memory does not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mixle_parallel.contracts import ParallelPlan, StepReceipt, to_dict
from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.ledger.chain import GENESIS, entry_hash
from mixle_parallel.verification.ledger.seal import SEAL_ROLE, sign_head, write_head


def _receipt(step: int) -> dict[str, Any]:
    return to_dict(StepReceipt(step=step, loss=1.0 / (step + 1), local_examples=8, local_tokens=64, microbatches=1,
                               accumulation_steps=1, data_parallel_size=2, optimizer="sgd", precision="fp32"))


def build_ledger(path: Path, entries: int, *, runs: int = 1) -> None:
    """Write a valid signed ledger of about ``entries`` entries in ``runs`` runs (no fsync: a fixture, not a run)."""
    signer = TrustStore().ensure_signer()
    plan = to_dict(ParallelPlan(dp_shard=2, tp=2))
    per_run = max(3, entries // runs)
    seq, prev = 0, GENESIS
    with open(path, "w", encoding="utf-8") as handle:
        def append(kind: str, payload: dict[str, Any]) -> None:
            nonlocal seq, prev
            body = {"seq": seq, "kind": kind, "time": "2026-01-01T00:00:00+00:00", "certificate": "unverified",
                    "payload": payload, "prev": prev}
            prev = entry_hash(body)
            handle.write(json.dumps({**body, "hash": prev}, sort_keys=True, separators=(",", ":")) + "\n")
            seq += 1

        for _ in range(runs):
            append("run_start", {"plan": plan, "executor": "bench", "certificate_document": None, "versions": {},
                                 "host": "bench", "pid": 1, "extra": {}})
            for step in range(per_run - 2):
                append("receipt", {"rank": 0, "step": step, "receipt": _receipt(step), "extra": {}})
            append("run_end", {"status": "ok", "steps": per_run - 2, "extra": {},
                               "seal": sign_head(signer, path, seq, prev, role=SEAL_ROLE)})
    write_head(path, sign_head(signer, path, seq, prev))


_CHILD = """
import json, resource, sys, time
from mixle_parallel.verification.ledger.verify import verify_ledger
started = time.perf_counter()
report = verify_ledger(sys.argv[1])
seconds = time.perf_counter() - started
assert report.ok, report.summary()
print(json.dumps({"entries": report.entries, "seconds": seconds,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def audit_in_child(path: Path) -> dict[str, Any]:
    """Audit ``path`` in a fresh interpreter; its entries, seconds and peak RSS in MB."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], check=True, capture_output=True, text=True,
                         env=os.environ.copy())
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        os.environ.setdefault("MIXLE_PARALLEL_HOME", os.path.join(folder, "home"))
        rows = []
        for size in args.sizes:
            path = Path(folder) / f"ledger-{size}.jsonl"
            build_ledger(path, size, runs=args.runs)
            rows.append(audit_in_child(path))
            path.unlink()
    base = rows[0]
    print(f"{'entries':>10} {'audit s':>9} {'peak MB':>9} {'time ratio':>11} {'memory ratio':>13}")
    for row in rows:
        print(f"{row['entries']:>10} {row['seconds']:>9.2f} {row['peak_mb']:>9.1f} "
              f"{row['seconds'] / base['seconds']:>11.2f} {row['peak_mb'] / base['peak_mb']:>13.2f}")


if __name__ == "__main__":
    main()
