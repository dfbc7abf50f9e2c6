"""Train a small language model with torch_native under torchrun.

    torchrun --standalone --nproc-per-node 2 examples/train_torchrun.py [--plan fsdp|ddp|tp]

The session creates the gloo process group from the torchrun environment; on a machine with no fitting
certificate it certifies in situ on these ranks first (once; stored for the next run); then it builds the
DeviceMesh from the plan, applies the transforms and prints one receipt per optimizer step on rank 0.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors import get_training_backend

VOCAB, DIM, SEQ = 64, 32, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


PLANS = {
    "fsdp": ParallelPlan(dp_shard=2, microbatches=2, gradient_accumulation_steps=2),
    "ddp": ParallelPlan(dp_replicate=2, gradient_accumulation_steps=2),
    "tp": ParallelPlan(tp=2),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", choices=sorted(PLANS), default="fsdp")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    plan = PLANS[args.plan]
    torch.manual_seed(0)  # same initial weights on every rank
    session = get_training_backend("torch_native").prepare(
        TinyLM(), plan=plan, optimizer="AdamW", lr=3e-3, max_grad_norm=1.0,  # no certificate: certified in situ
        tp_plan={"blocks.*.up": "colwise", "blocks.*.down": "rowwise", "head": "colwise_replicate"},
    )
    rank = int(os.environ.get("RANK", "0"))
    data = torch.Generator().manual_seed(100 + rank // plan.tp)  # TP ranks see the same batch
    try:
        while session.step < args.steps:
            tokens = torch.randint(0, VOCAB, (8, SEQ + 1), generator=data)
            receipt = session.train_batch(tokens[:, :-1], tokens[:, 1:])
            if rank == 0 and not receipt.skipped:
                print(f"step {receipt.step}: loss {receipt.loss:.4f} grad_norm {receipt.extra['grad_norm']:.3f} "
                      f"tokens {receipt.global_tokens_observed} bytes {receipt.collective_bytes} "
                      f"collectives {dict(receipt.extra['collectives'])}", flush=True)
    finally:
        session.close()


if __name__ == "__main__":
    main()
