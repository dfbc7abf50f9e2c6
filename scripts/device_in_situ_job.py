"""A launched torch_native run with no certificate: ``prepare`` certifies it in situ before the first step.

    torchrun --nproc-per-node N scripts/device_in_situ_job.py OUT.json

Run by ``scripts/device-check`` on a fresh trust store: on a GPU each rank drives ``cuda:LOCAL_RANK``
(world 1 on one GPU is already a real device mesh, so the gate needs a certificate and makes one on the
spot); on a CPU dry run two gloo ranks do the same. Rank 0 writes what the receipts say (admission,
certificate id, losses, device) to ``OUT.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch import nn

from mixle_parallel import ParallelPlan, get_training_backend

VOCAB, DIM = 64, 32


class TinyLM(nn.Module):
    """Embedding, one MLP block with a residual, and a vocabulary head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        return self.head(x + self.down(torch.relu(self.up(x))))


def main(out: str) -> None:
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    plan = ParallelPlan(dp_replicate=world)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    session = get_training_backend("torch_native").prepare(TinyLM(), plan=plan, optimizer="adamw", lr=3e-3)
    prepared_s = time.perf_counter() - t0
    batches = torch.Generator().manual_seed(rank)
    losses = []
    receipt = None
    for _ in range(5):
        tokens = torch.randint(0, VOCAB, (8, 17), generator=batches)
        receipt = session.train_batch(tokens[:, :-1], tokens[:, 1:])
        losses.append(float(receipt.loss))
    session.close()
    if rank == 0 and receipt is not None:
        doc = {"world_size": world, "cuda": torch.cuda.is_available(),
               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
               "admission": receipt.extra.get("admission"), "certificate": receipt.extra.get("certificate"),
               "prepare_s": prepared_s, "losses": losses}
        with open(out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, default=str)
        print(json.dumps(doc, default=str))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: torchrun --nproc-per-node N scripts/device_in_situ_job.py OUT.json")
    main(sys.argv[1])
