"""Small models, data and a hand-written single-process reference for the equivalence tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, SEQ = 32, 16, 8


class Block(nn.Module):
    """A residual MLP block (up: colwise, down: rowwise under TP)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class TinyLM(nn.Module):
    """Embedding -> 2 MLP blocks -> head; optionally the head is tied to the embedding."""

    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class AttnLM(nn.Module):
    """Non-causal single-head-group attention LM (permutation-equivariant, so CP load balancing is exact)."""

    def __init__(self, causal: bool = False) -> None:
        super().__init__()
        self.causal = causal
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        b, s, _ = x.shape
        q, k, v = self.layers[0](x).view(b, s, 3, 2, DIM // 2).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.layers[1](a.transpose(1, 2).reshape(b, s, DIM))
        return self.head(x)


TP_PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise", "head": "colwise_replicate"}


def make_model(kind: str = "mlp", tied: bool = False) -> nn.Module:
    """The same initial weights on every process ('mlp', 'attn' or 'causal_attn')."""
    torch.manual_seed(1234)
    return TinyLM(tied) if kind == "mlp" else AttnLM(causal=kind == "causal_attn")


def global_batches(steps: int, sizes: list[int], seed: int = 7) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """For each step, one (tokens, targets) batch per data-parallel rank with ``sizes[r]`` rows;
    a few targets are -100 (ignored) so token counts differ between ranks."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        per_rank = []
        for rows in sizes:
            x = torch.randint(0, VOCAB, (rows, SEQ), generator=g)
            y = torch.randint(0, VOCAB, (rows, SEQ), generator=g)
            y[torch.rand(rows, SEQ, generator=g) < 0.15] = -100
            per_rank.append((x, y))
        out.append(per_rank)
    return out


def reference_run(kind: str, batches: list, *, lr: float = 0.1, momentum: float = 0.9,
                  max_grad_norm: float | None = None, bf16: bool = False, tied: bool = False,
                  device: str = "cpu") -> dict:
    """The single-process truth: one global batch per step, loss = token-mean cross-entropy, SGD+momentum."""
    model = make_model(kind, tied).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses, norms = [], []
    for per_rank in batches:
        x = torch.cat([b[0] for b in per_rank]).to(device)
        y = torch.cat([b[1] for b in per_rank]).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(), y.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
        norms.append(float(norm))
        opt.step()
        losses.append(float(loss))
    return {
        "losses": losses,
        "norms": norms,
        "params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
    }
