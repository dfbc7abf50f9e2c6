"""Rank-agnostic bodies run inside real gloo worlds, and their single-process references."""

from __future__ import annotations

import warnings
from typing import Any

import torch

IN, HID, OUT = 4, 8, 3
LR = 0.05
STEPS = 2


def mlp() -> torch.nn.Sequential:
    """The 7-layer model the pipeline tests cut into stages (boundary activations are (HID,))."""
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HID), torch.nn.Tanh(), torch.nn.Linear(HID, HID), torch.nn.Tanh(),
        torch.nn.Linear(HID, HID), torch.nn.Tanh(), torch.nn.Linear(HID, OUT),
    )


def data(plan: Any, local_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (committed step, accumulation call, dp rank) batches: shape [S, G, dp, B, ...]."""
    g = torch.Generator().manual_seed(7)
    shape = (STEPS, plan.gradient_accumulation_steps, plan.data_parallel_size, local_batch)
    return torch.randn(*shape, IN, generator=g), torch.randn(*shape, OUT, generator=g)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, target)


def reference_run(plan: Any, local_batch: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Plain single-process torch: the same model, data, microbatching and AdamW."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    xs, ys = data(plan, local_batch)
    losses = []
    m, G, dp = plan.microbatches, plan.gradient_accumulation_steps, plan.data_parallel_size
    for s in range(STEPS):
        opt.zero_grad()
        seen = []
        for g in range(G):
            for r in range(dp):
                for x, y in zip(xs[s, g, r].chunk(m), ys[s, g, r].chunk(m)):
                    loss = mse(model(x), y)
                    (loss / (m * G * dp)).backward()
                    seen.append(float(loss))
        losses.append(sum(seen) / len(seen))
        opt.step()
    return {f"layers.{k}": v.detach().clone() for k, v in model.state_dict().items()}, losses


def receipt_dict(receipt: Any) -> dict[str, Any]:
    from mixle_parallel.contracts import to_dict

    return to_dict(receipt)["data"]


def pipeline_body(rank: int, world: int, plans: list[dict[str, int]], ckpt_dir: str | None) -> list[dict[str, Any]]:
    """Train each plan against the reference; check attestation vs megatron; then checkpoint checks."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state as ps

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    backend = get_training_backend("megatron")
    results = []
    for sizes in plans:
        plan = ParallelPlan(**sizes)
        local_batch = 2 * plan.microbatches
        session = backend.prepare(mlp(), plan=plan, loss_fn=mse, activation_shape=(HID,), optimizer="adam",
                                  lr=LR, admission="unverified")
        expected, ref_losses = reference_run(plan, local_batch)
        xs, ys = data(plan, local_batch)
        dp = session.data_parallel_rank
        receipts = []
        for s in range(STEPS):
            for g in range(plan.gradient_accumulation_steps):
                receipts.append(receipt_dict(session.train_batch(xs[s, g, dp], ys[s, g, dp])))
        errors = {}
        for name, param in session.stage.state_dict().items():
            errors[name] = float((param - expected[name]).abs().max())
        out = {
            "plan": sizes, "rank": rank, "errors": errors, "receipts": receipts, "ref_losses": ref_losses,
            "attested": session.attestation.coordinate.as_dict(),
            "megatron": {"pp": ps.get_pipeline_model_parallel_rank(), "tp": ps.get_tensor_model_parallel_rank(),
                         "dp": ps.get_data_parallel_rank(), "cp": ps.get_context_parallel_rank()},
            "reduce_sums": session.reduce_sums(1.0, float(rank)),
            "logging": session.is_logging_rank,
            "updates": [u.node_id for u in backend.describe_updates(plan)],
        }
        # accumulation controls: one pending micro-step, discarded, leaves the parameters alone
        if plan.gradient_accumulation_steps > 1:
            before = {k: v.clone() for k, v in session.stage.state_dict().items()}
            skipped = session.train_batch(xs[0, 0, dp], ys[0, 0, dp])
            discarded = session.discard_accumulation()
            same = all(torch.equal(before[k], v) for k, v in session.stage.state_dict().items())
            session.train_batch(xs[0, 0, dp], ys[0, 0, dp])
            finished = session.finish_accumulation()
            moved = any(not torch.equal(before[k], v) for k, v in session.stage.state_dict().items())
            out["accumulation"] = {"skipped": receipt_dict(skipped), "discarded": receipt_dict(discarded),
                                   "unchanged_after_discard": same, "finished": receipt_dict(finished),
                                   "moved_after_finish": moved, "nothing_pending": session.finish_accumulation()}
        if ckpt_dir is not None:
            out["checkpoint"] = _checkpoint_roundtrip(session, backend, plan, ckpt_dir, f"{ckpt_dir}/{len(results)}")
        session.close()
        results.append(out)
    return results


def _checkpoint_roundtrip(session: Any, backend: Any, plan: Any, root: str, path: str) -> dict[str, Any]:
    """Save under this plan, reload under dp-only (pp=1) in the same world and compare every tensor."""
    import torch.distributed as dist

    from mixle_parallel.contracts import ParallelPlan

    session.save_checkpoint(path)
    saved = {k: v.clone() for k, v in session.stage.state_dict().items()}
    saved.update(_moments(session))
    saved_step = session.state.step
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, saved)
    full = {k: v for part in gathered for k, v in part.items()}
    session.close()
    other = ParallelPlan(dp_replicate=dist.get_world_size())
    fresh = backend.prepare(mlp(), plan=other, loss_fn=mse, activation_shape=(HID,), lr=LR, admission="unverified")
    info = fresh.load_checkpoint(path)
    errors = {k: float((v - full[k]).abs().max()) for k, v in fresh.stage.state_dict().items()}
    optimizer_errors = {k: float((v - full[k]).abs().max()) for k, v in _moments(fresh).items()}
    fresh.close()
    return {"errors": errors, "step": info["step"], "saved_step": saved_step, "keys": sorted(errors),
            "optimizer_errors": optimizer_errors}


def _moments(session: Any) -> dict[str, torch.Tensor]:
    """Adam's moments of every stage parameter, keyed by the parameter's global name."""
    state = session.optimizer.chained_optimizers[0].optimizer.state
    out = {}
    for name, param in session.stage.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{key}:{name}"] = state[param][key].detach().clone()
    return out


# ---- tensor parallelism: megatron ColumnParallelLinear / RowParallelLinear --------------------
def tp_reference_model() -> torch.nn.Sequential:
    torch.manual_seed(99)
    return torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Tanh(), torch.nn.Linear(HID, OUT))


def _tp_builder(config: Any) -> torch.nn.Sequential:
    from mixle_parallel.executors.megatron.stages import tensor_parallel_mlp

    return torch.nn.Sequential(tensor_parallel_mlp(config, IN, HID, OUT, activation=torch.nn.Tanh()))


def _tp_shards(full: dict[str, torch.Tensor], tp_rank: int, tp: int) -> dict[str, torch.Tensor]:
    """Reference tensors cut the way megatron shards them: column rows, row columns, row bias whole."""
    h = HID // tp
    cut = slice(tp_rank * h, (tp_rank + 1) * h)
    return {
        "layers.0.0.layer.weight": full["0.weight"][cut], "layers.0.0.layer.bias": full["0.bias"][cut],
        "layers.0.2.layer.weight": full["2.weight"][:, cut], "layers.0.2.layer.bias": full["2.bias"],
    }


def tp_body(rank: int, world: int) -> dict[str, Any]:
    """tp=2 with megatron's tensor-parallel layers against a plain two-layer reference."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state as ps

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    plan = ParallelPlan(tp=2, microbatches=2)
    backend = get_training_backend("megatron")
    session = backend.prepare(_tp_builder, plan=plan, loss_fn=mse, activation_shape=(OUT,), lr=LR,
                              admission="unverified")
    reference = tp_reference_model()
    tp_rank = ps.get_tensor_model_parallel_rank()
    with torch.no_grad():
        for name, value in _tp_shards(reference.state_dict(), tp_rank, plan.tp).items():
            session.stage.get_parameter(name).copy_(value)
    opt = torch.optim.AdamW(reference.parameters(), lr=LR, weight_decay=0.0)
    xs, ys = data(plan, 4)
    receipts = []
    for s in range(STEPS):
        receipts.append(receipt_dict(session.train_batch(xs[s, 0, 0], ys[s, 0, 0])))
        opt.zero_grad()
        for x, y in zip(xs[s, 0, 0].chunk(2), ys[s, 0, 0].chunk(2)):
            (mse(reference(x), y) / 2).backward()
        opt.step()
    expected = _tp_shards(reference.state_dict(), tp_rank, plan.tp)
    errors = {k: float((session.stage.get_parameter(k) - v).abs().max()) for k, v in expected.items()}
    out = {"errors": errors, "receipts": receipts, "attested": session.attestation.coordinate.as_dict(),
           "megatron": {"tp": tp_rank, "pp": ps.get_pipeline_model_parallel_rank(), "dp": ps.get_data_parallel_rank()},
           "shapes": {k: list(session.stage.get_parameter(k).shape) for k in expected}}
    session.close()
    return out


# ---- expert parallelism: megatron MoELayer ----------------------------------------------------
EXPERTS, FFN = 4, 8
MOE_CONFIG = {"num_moe_experts": EXPERTS, "moe_router_topk": 2, "ffn_hidden_size": FFN, "add_bias_linear": False,
              "moe_aux_loss_coeff": 0.0, "moe_router_load_balancing_type": "none"}


class MoEBlock(torch.nn.Module):
    """megatron-core's MoELayer (local spec: SequentialMLP experts, TopKRouter) on (batch, hidden)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
        from megatron.core.transformer.spec_utils import build_module

        self.moe = build_module(get_moe_module_spec(use_te=False, num_experts=EXPERTS), config=config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out, _ = self.moe(hidden.unsqueeze(0))
        return out.squeeze(0)


def _moe_builder(config: Any) -> torch.nn.Sequential:
    return torch.nn.Sequential(MoEBlock(config))


def _moe_global_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    out = {"router": torch.randn(EXPERTS, IN, generator=g) * 0.5}
    for e in range(EXPERTS):
        out[f"fc1.{e}"] = torch.randn(FFN, IN, generator=g) * 0.3
        out[f"fc2.{e}"] = torch.randn(IN, FFN, generator=g) * 0.3
    return out


def moe_body(rank: int, world: int, sizes: dict[str, int]) -> dict[str, Any]:
    """Train the MoE block under ``sizes``; return every expert's final weights by global index."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state as ps

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    plan = ParallelPlan(**sizes)
    session = get_training_backend("megatron").prepare(
        _moe_builder, plan=plan, loss_fn=mse, activation_shape=(IN,), lr=LR, moe_config=MOE_CONFIG,
        admission="unverified")
    ep_rank, local = ps.get_expert_model_parallel_rank(), EXPERTS // plan.ep
    weights = _moe_global_weights()
    moe = session.stage.layers["0"].moe
    with torch.no_grad():
        moe.router.weight.copy_(weights["router"])
        for i, expert in enumerate(moe.experts.local_experts):
            expert.linear_fc1.weight.copy_(weights[f"fc1.{ep_rank * local + i}"])
            expert.linear_fc2.weight.copy_(weights[f"fc2.{ep_rank * local + i}"])
    g = torch.Generator().manual_seed(11)
    xs = torch.randn(STEPS, 2, 4, IN, generator=g)  # [step, global dp index (2), batch, hidden]
    ys = torch.randn(STEPS, 2, 4, IN, generator=g)
    dp, receipts = session.data_parallel_rank, []
    for s in range(STEPS):
        if plan.data_parallel_size == 1:  # the single-process reference sees the whole global batch
            x, y = xs[s].reshape(-1, IN), ys[s].reshape(-1, IN)
        else:
            x, y = xs[s, dp], ys[s, dp]
        receipts.append(receipt_dict(session.train_batch(x, y)))
    final = {"router": moe.router.weight.detach().clone()}
    for i, expert in enumerate(moe.experts.local_experts):
        final[f"fc1.{ep_rank * local + i}"] = expert.linear_fc1.weight.detach().clone()
        final[f"fc2.{ep_rank * local + i}"] = expert.linear_fc2.weight.detach().clone()
    out = {"final": final, "receipts": receipts, "attested": session.attestation.coordinate.as_dict(),
           "megatron_ep": ep_rank, "local_experts": len(moe.experts.local_experts),
           "updates": [u.node_id for u in get_training_backend("megatron").describe_updates(plan)]}
    session.close()
    return out


def world2_body(rank: int, world: int, ckpt_dir: str) -> dict[str, Any]:
    """Every world-2 scenario in one process world: pp=2 (+ checkpoint), tp=2, ep=2."""
    return {
        "pipeline": pipeline_body(rank, world, [dict(pp=2, microbatches=4, gradient_accumulation_steps=2)], ckpt_dir),
        "tp": tp_body(rank, world),
        "moe": moe_body(rank, world, dict(dp_replicate=2, ep=2, microbatches=2)),
    }


def world4_body(rank: int, world: int, ckpt_dir: str) -> dict[str, Any]:
    """pp=2 x dp=2 against the reference, then its checkpoint reloaded as dp=4."""
    return {"pipeline": pipeline_body(rank, world, [dict(pp=2, dp_replicate=2, microbatches=2,
                                                         gradient_accumulation_steps=2)], ckpt_dir)}


def reference_body(rank: int, world: int) -> dict[str, Any]:
    """The single-process (world 1) MoE reference: all experts local, the whole global batch."""
    return {"moe": moe_body(rank, world, dict(microbatches=4))}


# ---- seed= for an nn.Sequential (once ignored: only a builder was seeded) ---------------------------------
def _dropout_mlp() -> torch.nn.Sequential:
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Dropout(0.5), torch.nn.Linear(HID, OUT))


def seed_body(rank: int, world: int) -> dict[str, Any]:
    """Train the same dropout MLP three times: seed=3, seed=3 again (after drawing from the RNG), seed=4."""
    warnings.filterwarnings("ignore")
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    xs, ys = data(ParallelPlan(), 4)
    losses: dict[str, list[float]] = {}
    for name, seed in (("first", 3), ("again", 3), ("other", 4)):
        torch.rand(17)  # the RNG moves between runs: only seed= can make two runs draw the same masks
        session = get_training_backend("megatron").prepare(
            _dropout_mlp(), plan=ParallelPlan(), loss_fn=mse, activation_shape=(HID,), lr=LR, seed=seed,
            admission="unverified", health=False)
        losses[name] = [session.train_batch(xs[s, 0, 0], ys[s, 0, 0]).loss for s in range(STEPS)]
        session.close()
    return losses
