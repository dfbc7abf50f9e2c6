"""The plain single-process mixture-of-experts module of the ``moe`` verification workload.

A linear router without bias scores each token; the ``topk`` highest logits are kept and a
softmax over those ``topk`` gives the combine weights (the routing of megatron-core's TopKRouter
with ``moe_router_pre_softmax=False``, written here from that definition, sharing no code with
it); each expert is ``Linear -> GELU -> Linear`` without biases, and a token's output is the
weighted sum of its chosen experts' outputs. No capacity limit, no auxiliary loss.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def tiny_moe_class() -> type:
    """The module class, defined on first use so this module never imports torch eagerly."""
    import torch
    from torch import nn

    class TinyMoE(nn.Module):
        """Top-k routed experts on ``(tokens, hidden)`` inputs."""

        def __init__(self, hidden: int, ffn: int, experts: int, topk: int) -> None:
            super().__init__()
            self.topk = topk
            self.router = nn.Linear(hidden, experts, bias=False)
            self.experts = nn.ModuleList(
                nn.Sequential(nn.Linear(hidden, ffn, bias=False), nn.GELU(), nn.Linear(ffn, hidden, bias=False))
                for _ in range(experts))

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            chosen, index = torch.topk(self.router(tokens), self.topk, dim=-1)
            weights = torch.softmax(chosen, dim=-1)
            out = torch.zeros_like(tokens)
            for e, expert in enumerate(self.experts):
                token, slot = torch.nonzero(index == e, as_tuple=True)
                if token.numel():
                    out = out.index_add(0, token, weights[token, slot].unsqueeze(-1) * expert(tokens[token]))
            return out

    return TinyMoE


def build_tiny_moe(seed: int, *, hidden: int, ffn: int, experts: int, topk: int) -> Any:
    """``nn.Sequential(TinyMoE)`` initialized from ``seed`` (identical on every rank)."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(tiny_moe_class()(hidden, ffn, experts, topk))
