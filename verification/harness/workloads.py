"""Built-in verification workloads: an MLP, a tiny transformer LM, a Gaussian mixture.

Each is a small frozen config (so it crosses process boundaries) that builds its torch objects
lazily. Training workloads also compute the single-process reference: for every step the
global-batch ``loss``, its element ``count``, ``output``, every submodule's forward output ``output/<path>``, every
parameter's gradient ``grad/<name>`` and, after the optimizer step, ``param/<name>`` (names are the
plain module's ``named_modules`` / ``named_parameters``).
Users can pass their own workload implementing ``contracts.TrainingWorkload`` (and ``reference``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from ...contracts import ParallelPlan
from .em_reference import gaussian_mixture_reference
from .moe_module import build_tiny_moe
from .tiny_lm_module import tiny_lm_class
from .worker import to_numpy

TORCH_DTYPES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""Precision name -> torch dtype name used by the workloads."""


MIXED_PRECISIONS = frozenset({"bf16", "fp16"})
"""Precisions run as fp32 master weights with the forward under autocast (reference and executors alike)."""


def torch_dtype(precision: str) -> Any:
    """The torch dtype of a precision name (fp64, fp32, bf16, fp16)."""
    import torch

    if precision not in TORCH_DTYPES:
        raise ValueError(f"workloads run at {sorted(TORCH_DTYPES)}, not {precision!r}")
    return getattr(torch, TORCH_DTYPES[precision])


def data_parallel_index(plan: ParallelPlan, rank: int) -> int:
    """This rank's position among the data-parallel shards (dp_replicate major, dp_shard minor)."""
    coord = plan.coordinate(rank)
    return coord.dp_replicate * plan.dp_shard + coord.dp_shard


def shard(tensor: Any, plan: ParallelPlan, rank: int) -> Any:
    """This rank's contiguous slice of a global batch (dim 0), equal slices in data-parallel order."""
    size, index = plan.data_parallel_size, data_parallel_index(plan, rank)
    if tensor.shape[0] % size:
        raise ValueError(f"global batch {tensor.shape[0]} is not divisible by the data-parallel size {size}")
    step = tensor.shape[0] // size
    return tensor[index * step:(index + 1) * step]


class _TrainingWorkload:
    """Shared behaviour: seeded batches, data-parallel shards, SGD, the single-process reference."""

    steps: int
    lr: float
    precision: str

    def make_optimizer(self, params: Any) -> Any:
        """Plain SGD (deterministic, no state), so parameters after k steps are comparable."""
        import torch

        return torch.optim.SGD(params, lr=self.lr)

    def local_batch(self, step: int, seed: int, plan: ParallelPlan, rank: int) -> tuple[Any, Any]:
        """This rank's shard of the global batch of ``step``."""
        inputs, targets = self.global_batch(step, seed)
        return shard(inputs, plan, rank), shard(targets, plan, rank)

    def global_batch(self, step: int, seed: int) -> tuple[Any, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def build_module(self, seed: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def loss(self, output: Any, target: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def reference(self, seed: int, precision: str = "fp32") -> list[dict[str, np.ndarray]]:
        """Single-process run on the global batches: per step loss, output, grads, params after the step.

        fp64/fp32 run the module in that dtype; bf16/fp16 use the mixed-precision policy the
        executors use: fp32 master weights and gradients, the forward under ``torch.autocast``.
        """
        import contextlib

        import torch

        torch.use_deterministic_algorithms(True, warn_only=True)
        mixed = precision in MIXED_PRECISIONS
        module = self.build_module(seed).to(torch.float32 if mixed else torch_dtype(precision))
        optimizer = self.make_optimizer(module.parameters())
        outputs: dict[str, np.ndarray] = {}
        for path, sub in module.named_modules():
            if path:
                sub.register_forward_hook(functools.partial(_record_output, outputs, f"output/{path}"))
        out: list[dict[str, np.ndarray]] = []
        for step in range(self.steps):
            inputs, targets = self.global_batch(step, seed)
            if inputs.is_floating_point():
                inputs = inputs.to(torch.float32 if mixed else torch_dtype(precision))
            optimizer.zero_grad(set_to_none=True)
            autocast = (torch.autocast(device_type="cpu", dtype=torch_dtype(precision)) if mixed
                        else contextlib.nullcontext())
            with autocast:
                output = module(inputs)
                loss = self.loss(output, targets)
            loss.backward()
            record = {"loss": to_numpy(loss), "count": np.asarray(float(targets.numel())), "output": to_numpy(output),
                      **outputs}
            outputs.clear()
            record.update({f"grad/{n}": to_numpy(p.grad) for n, p in module.named_parameters()})
            optimizer.step()
            record.update({f"param/{n}": to_numpy(p) for n, p in module.named_parameters()})
            out.append(record)
        return out


def _record_output(outputs: dict[str, np.ndarray], key: str, module: Any, inputs: Any, output: Any) -> None:
    """A forward hook of the reference: keep a submodule's (first) tensor output under ``key``."""
    if isinstance(output, tuple) and output:
        output = output[0]
    if hasattr(output, "detach"):
        outputs[key] = to_numpy(output)



def _regression_batch(batch: int, in_features: int, out_features: int, step: int, seed: int) -> tuple[Any, Any]:
    """Seeded normal inputs ``(batch, in_features)`` and targets ``(batch, out_features)`` for ``step``."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(batch, in_features, generator=gen)
    return x, torch.randn(batch, out_features, generator=gen)


def _mse(output: Any, target: Any) -> Any:
    """Mean squared error in the output's dtype."""
    import torch

    return torch.nn.functional.mse_loss(output, target.to(output.dtype))


@attrs.frozen
class MLPWorkload(_TrainingWorkload):
    """Two-layer MLP regression (mean squared error) on seeded Gaussian inputs."""

    name: str = "mlp"
    in_features: int = 8
    hidden: int = 16
    out_features: int = 4
    batch: int = 16
    steps: int = 3
    lr: float = 0.1

    def build_module(self, seed: int) -> Any:
        """Linear -> tanh -> Linear, initialized from ``seed`` (identical on every rank)."""
        import torch

        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(self.in_features, self.hidden), torch.nn.Tanh(),
                                   torch.nn.Linear(self.hidden, self.out_features))

    def tp_plan(self) -> dict[str, str]:
        """Tensor-parallel styles by module path: the first layer column-wise, the second row-wise."""
        return {"0": "colwise", "2": "rowwise"}

    def global_batch(self, step: int, seed: int) -> tuple[Any, Any]:
        """Seeded inputs and targets for ``step``."""
        return _regression_batch(self.batch, self.in_features, self.out_features, step, seed)

    def loss(self, output: Any, target: Any) -> Any:
        """Mean squared error (a mean, so averaged shard gradients equal the global gradient)."""
        return _mse(output, target)


@attrs.frozen
class TinyLMWorkload(_TrainingWorkload):
    """A one-block transformer language model (causal unless ``causal=False``) on a seeded synthetic token corpus."""

    name: str = "tiny_lm"
    vocab: int = 32
    d_model: int = 16
    heads: int = 2
    layers: int = 1
    seq_len: int = 8
    batch: int = 8
    steps: int = 2
    lr: float = 0.1
    causal: bool = True

    def build_module(self, seed: int) -> Any:
        """Embedding, ``layers`` pre-norm blocks (attention q/k/v/o, MLP up/down), LM head."""
        import torch

        torch.manual_seed(seed)
        return tiny_lm_class()(self.vocab, self.d_model, self.heads, self.layers, self.seq_len, self.causal)

    def tp_plan(self) -> dict[str, str]:
        """Tensor-parallel styles by module path (torchtitan's: q/k/v and w1 column-wise, wo and w2 row-wise)."""
        return {"layers.*.attention.wq": "colwise", "layers.*.attention.wk": "colwise",
                "layers.*.attention.wv": "colwise", "layers.*.attention.wo": "rowwise",
                "layers.*.feed_forward.w1": "colwise", "layers.*.feed_forward.w2": "rowwise"}

    def attention_paths(self) -> tuple[str, ...]:
        """The attention modules, whose outputs are ``kv:cp``'s evidence (what the key/value exchange computes)."""
        return ("layers.*.attention",)

    def global_batch(self, step: int, seed: int) -> tuple[Any, Any]:
        """Next-token prediction on a seeded corpus with a learnable pattern."""
        import torch

        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        start = torch.randint(0, self.vocab, (self.batch, 1), generator=gen)
        stride = torch.randint(1, 4, (self.batch, 1), generator=gen)
        tokens = (start + stride * torch.arange(self.seq_len + 1)) % self.vocab
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def loss(self, output: Any, target: Any) -> Any:
        """Token-level mean cross entropy."""
        import torch

        return torch.nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


@attrs.frozen
class MoEWorkload(_TrainingWorkload):
    """A top-k routed mixture of experts regressing seeded targets (mean squared error): the expert-parallel
    workload. ``hidden`` is the token width; the reference is ``moe_module.TinyMoE``."""

    name: str = "moe"
    hidden: int = 8
    ffn: int = 8
    experts: int = 4
    topk: int = 2
    batch: int = 16
    steps: int = 3
    lr: float = 0.1

    def build_module(self, seed: int) -> Any:
        """``nn.Sequential(TinyMoE)`` initialized from ``seed``."""
        return build_tiny_moe(seed, hidden=self.hidden, ffn=self.ffn, experts=self.experts, topk=self.topk)

    def global_batch(self, step: int, seed: int) -> tuple[Any, Any]:
        """Seeded tokens and targets for ``step``."""
        return _regression_batch(self.batch, self.hidden, self.hidden, step, seed)

    def loss(self, output: Any, target: Any) -> Any:
        """Mean squared error."""
        return _mse(output, target)


@attrs.frozen
class GaussianMixtureWorkload:
    """EM on a seeded 1-D two-component Gaussian mixture, cut into ``num_chunks`` fixed chunks.

    An EM trial returns, per step, ``{"stats:data": {key: array}}`` with the keys of
    ``em_reference.EM_OBSERVABLE_KEYS`` (combined statistics per component, then the new parameters).
    """

    name: str = "gaussian_mixture"
    n: int = 800
    components: int = 2
    num_chunks: int = 8
    steps: int = 3

    def data(self, seed: int) -> np.ndarray:
        """The sample (float64, shape (n,))."""
        rng = np.random.default_rng(seed)
        means = np.linspace(-2.0, 2.0, self.components)
        labels = rng.integers(self.components, size=self.n)
        return rng.normal(means[labels], 0.8)

    def chunks(self, seed: int) -> list[np.ndarray]:
        """Chunk boundaries depend only on ``num_chunks``, never on the worker count."""
        return np.array_split(self.data(seed), self.num_chunks)

    def initial_model(self, seed: int) -> dict[str, np.ndarray]:
        """Equal weights, spread means, unit variances."""
        return {"weights": np.full(self.components, 1.0 / self.components),
                "means": np.linspace(-1.0, 1.0, self.components), "variances": np.ones(self.components)}

    def reference(self, seed: int, precision: str = "fp64") -> list[dict[str, np.ndarray]]:
        """The independent reference: EM over the whole sample in one piece (see ``em_reference``)."""
        if precision != "fp64":
            raise ValueError(f"the Gaussian-mixture workload runs at fp64, not {precision!r}")
        init = self.initial_model(seed)
        return gaussian_mixture_reference(self.data(seed), init["weights"], init["means"], init["variances"],
                                          self.steps)


def attention_workload() -> TinyLMWorkload:
    """The context-parallel workload: the tiny LM with non-causal (bidirectional) attention, which
    ring attention runs on CPU; causal context parallelism stays a device check."""
    return TinyLMWorkload(name="attention", causal=False)


BUILTIN_WORKLOADS: dict[str, Callable[[], Any]] = {
    "mlp": MLPWorkload, "tiny_lm": TinyLMWorkload, "attention": attention_workload,
    "gaussian_mixture": GaussianMixtureWorkload, "moe": MoEWorkload,
}
"""Workload names accepted by ``verify(workload=...)``."""


def resolve_workload(workload: Any) -> Any:
    """A workload object from a built-in name or an object (returned as is)."""
    if isinstance(workload, str):
        if workload not in BUILTIN_WORKLOADS:
            raise ValueError(f"unknown workload {workload!r}; built-in: {sorted(BUILTIN_WORKLOADS)}, or pass an object")
        return BUILTIN_WORKLOADS[workload]()
    return workload
