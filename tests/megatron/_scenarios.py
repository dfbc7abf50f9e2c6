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
    saved_step = session.state.step
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, saved)
    full = {k: v for part in gathered for k, v in part.items()}
    session.close()
    other = ParallelPlan(dp_replicate=dist.get_world_size())
    fresh = backend.prepare(mlp(), plan=other, loss_fn=mse, activation_shape=(HID,), lr=LR, admission="unverified")
    info = fresh.load_checkpoint(path)
    errors = {k: float((v - full[k]).abs().max()) for k, v in fresh.stage.state_dict().items()}
    # the reloaded optimizer state must continue identically on every rank
    fresh.close()
    return {"errors": errors, "step": info["step"], "saved_step": saved_step, "keys": sorted(errors)}
