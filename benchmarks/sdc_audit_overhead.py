"""In-session SDC audit overhead: torch_native sessions with the audit at its default rate vs audit off.

World 2 on gloo (CPU). For DDP and FSDP2, two sessions train the same model on the same batches:
one with ``audit=False``, one with the default audit (rate 0.05 plus the first step; an audited step
replays the local gradient on the same rank and on a peer and compares digests before
``optimizer.step()``). Steps alternate in blocks so machine load hits both alike. Prints the mean
step time of each over the measured steps (the mean, not the median: audited steps are the rare slow
ones) and their ratio (target <= 1.08).

    python benchmarks/sdc_audit_overhead.py [--steps 200] [--warmup 5] [--dim 256]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from train_step_overhead import LM, add_step_arguments

from mixle_parallel.verification.harness.mesh import run_world


def worker(rank: int, world_size: int, args: argparse.Namespace) -> list[tuple]:
    """One rank of the 2-rank gloo world (started by the project's one spawner); its rows of the table."""
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    rows = []
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    y = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    for kind, plan in (("ddp", ParallelPlan(dp_replicate=2)), ("fsdp", ParallelPlan(dp_shard=2))):
        sessions = {}
        for label, audit in (("plain", False), ("audited", None)):
            torch.manual_seed(0)
            sessions[label] = get_training_backend("torch_native").prepare(
                LM(args.vocab, args.dim, args.depth), plan=plan, audit=audit,
                optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), admission="unverified")
        times = {"plain": [], "audited": []}
        for _ in range(args.warmup):
            sessions["plain"].train_batch(x, y)
        block = 10
        for i in range(0, args.steps, block):
            order = ("plain", "audited") if (i // block) % 2 == 0 else ("audited", "plain")
            for label in order:
                s = sessions[label]
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(block):
                    s.train_batch(x, y)
                times[label].append((time.perf_counter() - t0) / block)
        audit = sessions["audited"]._audit
        plain, audited = (sum(times[k]) / len(times[k]) for k in ("plain", "audited"))
        rows.append((kind, args.steps, audit.audited_steps, plain * 1e3, audited * 1e3, audited / plain))
        for s in sessions.values():
            s.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(parser, steps=200)
    args = parser.parse_args()
    if args.steps < 100:
        parser.error("--steps must be >= 100 so a 5% audit rate audits a handful of steps")
    rows = run_world(worker, 2, args, timeout=3600.0)[0]
    print(f"world 2 (gloo, CPU), dim={args.dim} depth={args.depth} vocab={args.vocab} "
          f"batch={args.batch}x{args.seq} per rank, default audit rate (0.05 + first step)")
    print(f"{'transform':<10}{'steps':>7}{'audited':>9}{'plain ms':>10}{'audited ms':>12}{'ratio':>8}")
    for kind, n, audited_steps, plain, audited, ratio in rows:
        print(f"{kind:<10}{n:>7}{audited_steps:>9}{plain:>10.2f}{audited:>12.2f}{ratio:>8.3f}")


if __name__ == "__main__":
    main()
