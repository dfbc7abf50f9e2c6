"""Rank bodies and the single-process reference for the StreamingTokenEncodedData tests (a tiny next-token LM)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, BLOCK, BATCH, EPOCHS, LR = 11, 6, 4, 4, 2, 0.05
# 25 tokens over 2 ranks: shards of 12 and 13 tokens, 8 and 9 windows, so 3 steps an epoch with rank 0's
# third batch empty (fully masked) and rank 1's holding one window
TOKENS = np.random.RandomState(7).randint(0, VOCAB, size=25)


class TinyNextTokenLM(nn.Module):
    """Embedding -> flatten -> linear: next-token logits (batch, vocab) from contexts (batch, block)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.head = nn.Linear(BLOCK * DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x.long()).flatten(1))


def fresh_model() -> TinyNextTokenLM:
    torch.manual_seed(0)
    return TinyNextTokenLM()


def reference(tokens: np.ndarray, world: int, *, shuffle: bool = True, seed: int = 0) -> dict[str, Any]:
    """Plain torch loop on one process: each step's batch is the union of the ranks' batches, in rank order,
    and the loss is the mean over all of them (AdamW, no code shared with the handle)."""
    model = fresh_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    n = len(tokens)
    shards = [tokens[r * n // world:(r + 1) * n // world] for r in range(world)]
    losses = []
    for epoch in range(EPOCHS):
        per_rank = []
        for shard in shards:
            count = len(shard) - BLOCK
            order = np.random.RandomState(seed + epoch).permutation(count) if shuffle else np.arange(count)
            per_rank.append((shard, [order[k:k + BATCH] for k in range(0, count, BATCH)]))
        for step in range(max(len(b) for _, b in per_rank)):
            xs = [np.stack([s[i:i + BLOCK] for i in b[step]]) for s, b in per_rank if step < len(b)]
            ys = [s[b[step] + BLOCK] for s, b in per_rank if step < len(b)]
            x, y = torch.as_tensor(np.concatenate(xs)), torch.as_tensor(np.concatenate(ys))
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return {"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses}


def streaming_world(rank: int, world_size: int, port: int) -> dict[str, Any]:
    """The spawner's group is replaced by one the handle creates from the torchrun environment (mixle's
    init path); mixle's own seq_estimate drives the handle with mixle's StreamingTransformerLeafEstimator."""
    from mixle.models.streaming_transformer_leaf import StreamingTransformerLeafEstimator
    from mixle.stats.compute.sequence import seq_estimate

    from mixle_parallel.torch_neural import StreamingTokenEncodedData

    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(port)
    handle = StreamingTokenEncodedData(TOKENS, block=BLOCK, batch_size=BATCH, epochs=EPOCHS,
                                       admission="unverified", session_options={"audit": False, "health": False})
    owned = handle.owns_process_group
    shard = (handle._ids.tolist(), handle._ids.base is None)  # only this rank's slice, in its own array
    fitted = seq_estimate(handle, StreamingTransformerLeafEstimator(fresh_model(), lr=LR), None)
    log_density = handle.pysp_seq_log_density_sum(fitted)
    out = {
        "owned": owned, "shard": shard, "type": type(fitted).__name__, "plan": handle.plan().describe(),
        "schedule": handle.schedule_receipt, "log_density": log_density,
        "params": {k: v.detach().clone() for k, v in fitted.module.state_dict().items()},
        "receipts": [(r.step, r.loss, r.skipped, r.local_tokens, r.global_tokens_observed, r.collective_bytes,
                      dict(r.extra["collectives"]), r.data_parallel_size) for r in handle.receipts],
    }
    out["fsdp"] = _fsdp_run()  # a second handle in the same group (not its own): FSDP2 on gloo
    handle.close()
    out["closed"] = not dist.is_initialized()
    # the spawner destroys the default group when this returns: give it a fresh one
    dist.init_process_group("gloo", init_method=f"file://{os.environ['MIXLE_PARALLEL_MESH_STORE_DIR']}/after",
                            rank=rank, world_size=world_size)
    return out


def _full(value: Any) -> torch.Tensor:
    return (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().clone()


def _fsdp_run() -> dict[str, Any]:
    from mixle.models.streaming_transformer_leaf import StreamingTransformerLeafEstimator

    from mixle_parallel.torch_neural import StreamingTokenEncodedData

    handle = StreamingTokenEncodedData(TOKENS, block=BLOCK, batch_size=BATCH, epochs=EPOCHS, parallel="fsdp",
                                       admission="unverified", session_options={"audit": False, "health": False})
    fitted = handle.pysp_seq_estimate(StreamingTransformerLeafEstimator(fresh_model(), lr=LR), None)
    out = {"owned": handle.owns_process_group, "plan": handle.plan().describe(),
           "log_density": handle.pysp_seq_log_density_sum(fitted),  # FSDP2 forwards: equal counts on every rank
           "params": {k: _full(v) for k, v in fitted.module.state_dict().items()},
           "collectives": [dict(r.extra["collectives"]) for r in handle.receipts]}
    handle.close()
    return out
