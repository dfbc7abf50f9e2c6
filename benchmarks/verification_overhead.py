"""Verification costs, measured side by side: certification time of one plan family and SDC-audit step overhead.

    python benchmarks/verification_overhead.py [--steps 200] [--skip-certify]

1. Certification: wall time of ``verify`` + ``certify`` for torch_native on (dp_shard=2, tp=2),
   4 CPU gloo ranks, tiny transformer LM (process start and gloo rendezvous included).
2. SDC audit: one process trains the tiny LM for N steps twice, interleaved in blocks: plain,
   and with ``TrainingAuditor`` at the default rate (0.05 plus the first step), where an audited
   step replays the local gradient (one more forward/backward) and compares digests before
   ``optimizer.step()``. Prints the step-time ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.verification import AuditSchedule, TinyLMWorkload, TrainingAuditor, verify


def certification_seconds() -> float:
    spec = "torch_native"  # a registered name: the harness measures its verification target
    started = time.perf_counter()
    report = verify(spec, ParallelPlan(dp_shard=2, tp=2), precision="fp32", workload="tiny_lm")
    report.certify(spec)
    return time.perf_counter() - started


def train(steps: int, audited: bool, workload: TinyLMWorkload) -> float:
    torch.manual_seed(0)
    module = workload.build_module(0)
    optimizer = workload.make_optimizer(module.parameters())
    auditor = TrainingAuditor(AuditSchedule(), policy="skip_step")
    params = list(module.named_parameters())

    def local_grads(x, y):
        optimizer.zero_grad(set_to_none=True)
        workload.loss(module(x), y).backward()
        return {n: p.grad.detach().clone() for n, p in params}

    started = time.perf_counter()
    for step in range(steps):
        x, y = workload.global_batch(step, 0)
        grads = local_grads(x, y)
        if audited and auditor.should_audit(step):
            verdict = auditor.audit(step=step, rank=0, observed=grads, recompute=lambda x=x, y=y: local_grads(x, y))
            if verdict.skip:
                continue
            for n, p in params:
                p.grad = grads[n]
        optimizer.step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--skip-certify", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    workload = TinyLMWorkload(vocab=64, d_model=64, heads=4, layers=2, seq_len=32, batch=16)
    plain = audited = 0.0
    for _ in range(args.blocks):  # interleaved so load changes hit both sides alike
        plain += train(args.steps, False, workload)
        audited += train(args.steps, True, workload)
    audited_steps = len(AuditSchedule().audited_steps(0, args.steps))
    print("| measurement | value |")
    print("|---|---|")
    print(f"| SDC audit, default rate: audited steps | {audited_steps} of {args.steps} |")
    print(f"| step time, plain (ms) | {1e3 * plain / (args.blocks * args.steps):.2f} |")
    print(f"| step time, audited (ms) | {1e3 * audited / (args.blocks * args.steps):.2f} |")
    print(f"| audited / plain | {audited / plain:.3f}x |")
    if not args.skip_certify:
        print(f"| certify torch_native dp_shard=2 x tp=2, 4 CPU ranks (s) | {certification_seconds():.1f} |")


if __name__ == "__main__":
    main()
