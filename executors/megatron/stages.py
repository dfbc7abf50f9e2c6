"""Pipeline stages for megatron-core: cut an ``nn.Sequential`` into contiguous stages.

Megatron's schedules move activations between stages as ``(seq, micro_batch, hidden)`` tensors
and hand a stage its received input through ``set_input_tensor``. ``PipelineStage`` wraps the
layers this rank owns so that an ordinary batch-first model fits: the boundary activation of one
example has the shape ``activation_shape`` (``(hidden,)`` or ``(seq, hidden)``), transposed to
megatron's layout for transport and back on arrival.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from megatron.core.enums import ModelType


def stage_bounds(
    num_layers: int, num_stages: int, boundaries: Sequence[int] | None = None
) -> tuple[tuple[int, int], ...]:
    """``(start, stop)`` layer ranges of every stage: ``boundaries`` (cut points) or balanced by count."""
    if num_stages > num_layers:
        raise ValueError(
            f"pp={num_stages} stages need at least {num_stages} layers, the model has {num_layers}; "
            "lower pp or split the model into more nn.Sequential children"
        )
    if boundaries is None:
        base, extra = divmod(num_layers, num_stages)
        cuts, start = [], 0
        for s in range(num_stages - 1):
            start += base + (1 if s < extra else 0)
            cuts.append(start)
    else:
        cuts = [int(c) for c in boundaries]
        if len(cuts) != num_stages - 1 or cuts != sorted(set(cuts)) or not all(0 < c < num_layers for c in cuts):
            raise ValueError(
                f"stage_boundaries={list(boundaries)} must be {num_stages - 1} increasing cut points "
                f"strictly inside (0, {num_layers})"
            )
    edges = [0, *cuts, num_layers]
    return tuple((edges[i], edges[i + 1]) for i in range(num_stages))


class PipelineStage(torch.nn.Module):
    """The layers of one pipeline stage, speaking megatron's stage protocol."""

    def __init__(
        self,
        layers: torch.nn.Sequential,
        *,
        config: object,
        stage: int,
        num_stages: int,
        activation_shape: tuple[int, ...],
        first_layer_index: int,
    ) -> None:
        super().__init__()
        if len(activation_shape) not in (1, 2):
            raise ValueError(
                f"activation_shape={activation_shape} must be (hidden,) or (seq, hidden): the shape of one "
                "example's activation at a stage boundary"
            )
        # Keep the global layer indices as names so state dicts and checkpoints stay stage-independent.
        self.layers = torch.nn.ModuleDict({str(first_layer_index + i): layer for i, layer in enumerate(layers)})
        self.config = config
        self.model_type = ModelType.encoder_or_decoder
        self.stage = stage
        self.num_stages = num_stages
        self.pre_process = stage == 0
        self.post_process = stage == num_stages - 1
        self.share_embeddings_and_output_weights = False
        self.activation_shape = tuple(activation_shape)
        self._received: torch.Tensor | None = None

    def set_input_tensor(self, input_tensor: torch.Tensor | list[torch.Tensor | None] | None) -> None:
        """Megatron hands the activation received from the previous stage here before ``forward``."""
        if isinstance(input_tensor, list):
            input_tensor = input_tensor[0]
        self._received = input_tensor

    def forward(self, inputs: torch.Tensor | None) -> torch.Tensor:
        """Run this stage's layers on the batch (first stage) or the received activation."""
        if self.pre_process:
            assert inputs is not None  # MegatronSession refuses a first stage without inputs
            hidden = inputs
        else:
            if self._received is None:
                raise RuntimeError(f"pipeline stage {self.stage} ran without a received activation")
            hidden = self._from_transport(self._received)
        for layer in self.layers.values():
            hidden = layer(hidden)
        if self.post_process:
            return hidden
        return self._to_transport(hidden)

    def _to_transport(self, hidden: torch.Tensor) -> torch.Tensor:
        expected = self.activation_shape
        if tuple(hidden.shape[1:]) != expected:
            raise ValueError(
                f"stage {self.stage} produced activations of per-example shape {tuple(hidden.shape[1:])}, "
                f"but activation_shape={expected}; every stage boundary must carry that shape"
            )
        if len(expected) == 1:
            return hidden.unsqueeze(0)  # (1, batch, hidden)
        return hidden.transpose(0, 1).contiguous()  # (seq, batch, hidden)

    def _from_transport(self, received: torch.Tensor) -> torch.Tensor:
        if len(self.activation_shape) == 1:
            return received.squeeze(0)
        return received.transpose(0, 1)


def transport_shape(activation_shape: tuple[int, ...]) -> tuple[int, int]:
    """``(seq_length, hidden_size)`` megatron's schedules use for a boundary activation."""
    if len(activation_shape) == 1:
        return 1, int(activation_shape[0])
    return int(activation_shape[0]), int(activation_shape[1])


class DropBias(torch.nn.Module):
    """Adapts a megatron parallel linear (which returns ``(output, bias)``) to a plain layer."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The layer's output; a deferred bias (``skip_bias_add``) is added here."""
        out, bias = self.layer(hidden)
        return out if bias is None else out + bias


def tensor_parallel_mlp(
    config: object, in_features: int, hidden_features: int, out_features: int, activation: torch.nn.Module | None = None
) -> torch.nn.Sequential:
    """ColumnParallelLinear -> activation -> RowParallelLinear: megatron's tensor-parallel MLP block."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    init = torch.nn.init.xavier_uniform_
    return torch.nn.Sequential(
        DropBias(
            ColumnParallelLinear(
                in_features, hidden_features, config=config, init_method=init, bias=True, gather_output=False
            )
        ),
        activation if activation is not None else torch.nn.GELU(),
        DropBias(
            RowParallelLinear(
                hidden_features,
                out_features,
                config=config,
                init_method=init,
                bias=True,
                input_is_parallel=True,
                skip_bias_add=False,
            )
        ),
    )
