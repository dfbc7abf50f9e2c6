"""In-session SDC audit overhead: torch_native sessions with the audit at its default rate vs audit off.

World 2 on gloo (CPU). For DDP and FSDP2, two sessions train the same model on the same batches:
one with ``audit=False``, one with the default audit (the session's default rate plus the first step; an audited step's
local gradient is recomputed by a peer on a plain copy of the module, FSDP2's full parameters gathered
into it, and the digests compared before ``optimizer.step()``). Both sessions are warmed up alike
(``--warmup`` steps each, outside the measured window); the audited session's always-audited first step
falls in its warm-up and its time is reported on its own (``first ms``, next to the plain session's first
step). Measured steps alternate in blocks so machine load hits both alike. Prints the mean step time of
each over the measured steps (the mean, not the median: audited steps are the rare slow ones), how many
measured steps were audited, and their ratio (target <= 1.05 at the default rate). How many steps the seeded
draw audits varies (200 steps at 5%: 10 +- 3), and that alone moves the ratio by +-0.03, so each audited-session
step is also timed on its own: ``audited step x`` is an audited step's mean time over an unaudited step's of the
same session, and ``at rate`` the ratio expected at exactly the rate r, ``1 + r x (audited step x - 1)``. (An
unaudited step of the audited session runs the same calls as a plain session's step, cProfile: the two sessions'
unaudited steps differ only by machine noise, +-3% between runs here, which the measured ratio carries.)
``--rate 1.0`` audits every step: its ratio is the cost of one audited step relative to a plain one.

``--tp`` adds a tensor-parallel row (tp=2, both ranks on the same batch): its audited steps also gather the full
parameters into a plain copy and judge each rank's gradient shard against it within a tolerance.

    python benchmarks/sdc_audit_overhead.py [--steps 200] [--warmup 5] [--dim 256] [--rate R] [--tp]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from train_step_overhead import LM, add_step_arguments

from mixle_parallel.verification.harness.mesh import run_world
from mixle_parallel.verification.sdc.schedule import TRAINING_AUDIT_RATE

TP_PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise", "head": "colwise_replicate"}
"""The ``--tp`` row's tensor-parallel plan for the benchmark LM."""


def worker(rank: int, world_size: int, args: argparse.Namespace) -> list[tuple]:
    """One rank of the 2-rank gloo world (started by the project's one spawner); its rows of the table."""
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    rows = []
    plans = [("ddp", ParallelPlan(dp_replicate=2)), ("fsdp", ParallelPlan(dp_shard=2))]
    for kind, plan in plans + ([("tp", ParallelPlan(tp=2))] if args.tp else []):
        g = torch.Generator().manual_seed(rank if plan.tp == 1 else 0)  # TP ranks share their batch
        x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        y = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
        sessions = {}
        audited_options = {} if args.rate is None else {"audit_rate": args.rate}
        if plan.tp > 1:
            audited_options = {**audited_options, "tp_plan": TP_PLAN}
        plain_options = {"audit": False, **({"tp_plan": TP_PLAN} if plan.tp > 1 else {})}
        for label, options in (("plain", plain_options), ("audited", audited_options)):
            torch.manual_seed(0)
            sessions[label] = get_training_backend("torch_native").prepare(
                LM(args.vocab, args.dim, args.depth), plan=plan, **options,
                optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), admission="unverified")
        times: dict[str, list[float]] = {"plain": [], "audited": []}
        per_step: dict[bool, list[float]] = {True: [], False: []}  # the audited session's steps, by audited or not
        first = {}
        for step in range(args.warmup):
            for label, s in sessions.items():
                dist.barrier()
                t0 = time.perf_counter()
                s.train_batch(x, y)
                if step == 0:
                    first[label] = time.perf_counter() - t0
        warm_audited = sessions["audited"]._audit.audited_steps
        block = 10
        for i in range(0, args.steps, block):
            order = ("plain", "audited") if (i // block) % 2 == 0 else ("audited", "plain")
            for label in order:
                s = sessions[label]
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(block):
                    before, t1 = s._audit.audited_steps if label == "audited" else 0, time.perf_counter()
                    s.train_batch(x, y)
                    if label == "audited":
                        per_step[s._audit.audited_steps > before].append(time.perf_counter() - t1)
                times[label].append((time.perf_counter() - t0) / block)
        audit = sessions["audited"]._audit
        plain, audited = (sum(times[k]) / len(times[k]) for k in ("plain", "audited"))
        rows.append((kind, args.steps, audit.audited_steps - warm_audited, plain * 1e3, audited * 1e3,
                     audited / plain, first["plain"] * 1e3, first["audited"] * 1e3,
                     *_at_rate(per_step, audit.schedule.rate)))
        for s in sessions.values():
            s.close()
    return rows


def _at_rate(per_step: dict[bool, list[float]], rate: float) -> tuple[float, float]:
    """(an audited step's mean time over an unaudited one's, both of the audited session; the ratio expected at
    exactly ``rate``, ``1 + rate x (that - 1)``): free of how many steps the seeded draw happened to audit."""
    if not per_step[True] or not per_step[False]:
        return float("nan"), float("nan")
    step_x = (sum(per_step[True]) / len(per_step[True])) / (sum(per_step[False]) / len(per_step[False]))
    return step_x, 1.0 + rate * (step_x - 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(parser, steps=200)
    parser.add_argument("--tp", action="store_true", help="add a tensor-parallel (tp=2) row")
    parser.add_argument("--rate", type=float, default=None,
                        help=f"audit rate of the audited session (default: the session's, {TRAINING_AUDIT_RATE})")
    args = parser.parse_args()
    if args.rate is None and args.steps < 100:
        parser.error(f"--steps must be >= 100 so a {TRAINING_AUDIT_RATE:.0%} audit rate audits a handful of steps")
    if args.rate is not None and not 0.0 <= args.rate <= 1.0:
        parser.error(f"--rate {args.rate} must be within [0, 1]")
    if args.warmup < 1:
        parser.error("--warmup must be >= 1: the audited session's first step (always audited) is warm-up")
    rows = run_world(worker, 2, args, timeout=3600.0)[0]
    print(f"world 2 (gloo, CPU), dim={args.dim} depth={args.depth} vocab={args.vocab} "
          f"batch={args.batch}x{args.seq} per rank, audit rate "
          f"{f'{TRAINING_AUDIT_RATE} (default)' if args.rate is None else args.rate} + first step, {args.warmup} "
          "warm-up steps each")
    print(f"{'transform':<10}{'steps':>7}{'audited':>9}{'plain ms':>10}{'audited ms':>12}{'ratio':>8}"
          f"{'audited step x':>16}{'at rate':>9}{'first ms (plain/audited)':>27}")
    for kind, n, audited_steps, plain, audited, ratio, first_plain, first_audited, step_x, at_rate in rows:
        print(f"{kind:<10}{n:>7}{audited_steps:>9}{plain:>10.2f}{audited:>12.2f}{ratio:>8.3f}{step_x:>16.3f}"
              f"{at_rate:>9.3f}{first_plain:>14.1f} / {first_audited:.1f}")


if __name__ == "__main__":
    main()
