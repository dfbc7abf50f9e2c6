"""The plain single-process transformer language model of the ``tiny_lm`` and ``attention`` workloads.

Parameter names follow torchtitan's: ``tok_embeddings``, ``layers.<i>.attention.{wq,wk,wv,wo}``,
``layers.<i>.feed_forward.{w1,w2}``, ``layers.<i>.{attention_norm,ffn_norm}``, ``norm``, ``output``
(plus ``pos_embeddings`` for the causal variant). Each class is defined on first use, so this module
never imports torch eagerly.
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _attention_class() -> type:
    import torch
    from torch import nn

    class Attention(nn.Module):
        """Multi-head scaled dot-product attention with q/k/v/o projections without bias."""

        def __init__(self, d_model: int, heads: int, causal: bool) -> None:
            super().__init__()
            self.head_dim = d_model // heads  # local head count follows from it under tensor parallelism
            self.causal = causal
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            return self.wo(y.transpose(1, 2).reshape(b, t, -1))

    return Attention


@functools.cache
def _block_class() -> type:
    import torch
    from torch import nn

    attention = _attention_class()

    class FeedForward(nn.Module):
        """``w2(gelu(w1(x)))`` with a 4x hidden width."""

        def __init__(self, d_model: int) -> None:
            super().__init__()
            self.w1, self.w2 = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w2(nn.functional.gelu(self.w1(x)))

    class Block(nn.Module):
        """A pre-norm transformer block: attention, then the feed-forward, each on a residual."""

        def __init__(self, d_model: int, heads: int, causal: bool) -> None:
            super().__init__()
            self.attention_norm, self.ffn_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.attention, self.feed_forward = attention(d_model, heads, causal), FeedForward(d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attention(self.attention_norm(x))
            return x + self.feed_forward(self.ffn_norm(x))

    return Block


@functools.cache
def tiny_lm_class() -> type:
    """The tiny LM module class: token embedding (+ learned positions when causal), blocks, norm, LM head."""
    import torch
    from torch import nn

    block = _block_class()

    class TinyTransformerLM(nn.Module):
        """Token embedding + learned positions, pre-norm blocks, final norm, LM head."""

        def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq_len: int, causal: bool) -> None:
            super().__init__()
            self.tok_embeddings = nn.Embedding(vocab, d_model)
            # learned absolute positions index the whole sequence; under context parallelism a rank
            # holds only a slice of it, so the bidirectional (CP) variant has none
            self.pos_embeddings = nn.Parameter(torch.randn(seq_len, d_model) * 0.02) if causal else None
            self.layers = nn.ModuleList(block(d_model, heads, causal) for _ in range(layers))
            self.norm, self.output = nn.LayerNorm(d_model), nn.Linear(d_model, vocab, bias=False)

        def forward(self, tokens: Any) -> Any:
            x = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                x = x + self.pos_embeddings[: tokens.shape[1]]
            for layer in self.layers:
                x = layer(x)
            return self.output(self.norm(x))

    return TinyTransformerLM
