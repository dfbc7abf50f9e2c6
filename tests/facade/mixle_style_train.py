"""A training script written against mixle 0.8.2's API; only the import prefix says mixle_parallel.

Run:  python tests/facade/mixle_style_train.py OUT_DIR
Lightning Fabric (mixle's ``create(plan=...)`` form, CPU ``ddp``) re-runs this script for rank 1;
every rank trains mixle's own CausalLM with torch_native's default loss and writes
OUT_DIR/rank<R>.json. Admission comes from the environment (MIXLE_PARALLEL_CERTIFICATE), as a
mixle script passes no admission option.
"""

from __future__ import annotations

import json
import pathlib
import sys

import torch
from mixle.models.transformer import build_causal_lm

from mixle_parallel.training_contracts import ParallelPlan, get_training_backend
from mixle_parallel.training_launchers import LightningFabricLauncher

PLAN = ParallelPlan(dp_replicate=2)
VOCAB, BLOCK, BATCH, STEPS = 32, 8, 4, 3


def train(fabric, out_dir: str) -> None:
    """One rank: prepare mixle's CausalLM, train STEPS batches, record receipts and the attestation."""
    attestation = fabric.attest_topology()
    torch.manual_seed(0)
    model = build_causal_lm(vocab=VOCAB, d_model=16, n_layer=1, n_head=2, block=BLOCK)
    session = get_training_backend("torch_native").prepare(model, plan=PLAN, optimizer="SGD", lr=0.5)
    gen = torch.Generator().manual_seed(100 + fabric.global_rank)
    receipts = []
    for _ in range(STEPS):
        tokens = torch.randint(0, VOCAB, (BATCH, BLOCK + 1), generator=gen)
        receipts.append(session.train_batch(tokens[:, :-1], tokens[:, 1:]))
    first = next(p for p in session.module.parameters())
    record = {
        "rank": fabric.global_rank,
        "coordinate": dict(attestation.coordinate),
        "mesh": list(map(list, PLAN.mesh)),
        "steps": [r.step for r in receipts],
        "losses": [r.loss for r in receipts],
        "global_tokens": [r.global_tokens for r in receipts],
        "global_examples": [r.global_examples for r in receipts],
        "param_sum": float(first.detach().double().sum()),
    }
    session.close()
    pathlib.Path(out_dir, f"rank{fabric.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    assert PLAN.mesh == (("dp_replicate",), (2,))
    fabric = LightningFabricLauncher().create(plan=PLAN, accelerator="cpu", devices=2, admission="unverified")
    fabric.launch(train, sys.argv[1])
