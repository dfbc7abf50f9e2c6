"""Session overhead: TorchDistributedSession.train_batch vs a hand-written loop with the same transforms.

World 2 on gloo (CPU). For DDP and FSDP2, both loops train the same model on the same batches;
steps alternate in blocks (hand, session, hand, ...) so machine load hits both alike. Prints the
median step time of each over >= 30 measured steps after warm-up, and their ratio.

The hand loop uses each transform's defaults, as a user writes it. The session's DDP keeps its
gradients as views of DDP's buckets (``gradient_as_bucket_view=True``), which saves the copy out of
the buckets that pays for its gradient norm; ``--tuned-hand`` adds the row ``ddp, hand as tuned``,
whose hand loop has that option too, to show the cost of the receipts over an equally tuned loop.

    python benchmarks/train_step_overhead.py [--steps 40] [--warmup 5] [--dim 256] [--audit] [--no-health]
        [--tuned-hand]

The session's SDC audit is off here (``--audit`` keeps its default rate on); its cost is measured
by benchmarks/sdc_audit_overhead.py.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mixle_parallel.verification.harness.mesh import run_world


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


class LM(nn.Module):
    def __init__(self, vocab: int, dim: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(depth)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def hand_written(kind: str, model: nn.Module, mesh, *, bucket_view: bool = False,
                 ) -> tuple[nn.Module, torch.optim.Optimizer]:
    """What a user writes by hand: the same DDP / fully_shard transforms, mean loss, backward, step."""
    if kind == "ddp":
        from mixle_parallel.executors.torch.parallelize import BUFFER_SYNC_OPTION

        no_buffer_sync: dict = {BUFFER_SYNC_OPTION: False}  # the model has no buffers (torch's own flag name)
        model = nn.parallel.DistributedDataParallel(model, device_mesh=mesh["dp_replicate"],
                                                    gradient_as_bucket_view=bucket_view, **no_buffer_sync)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(model, mesh=mesh["dp_shard"])
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def worker(rank: int, world_size: int, args: argparse.Namespace) -> list[tuple]:
    """One rank of the 2-rank gloo world (started by the project's one spawner); its rows of the table."""
    from torch.distributed.device_mesh import init_device_mesh

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    rows = []
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    y = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    configs = [("ddp", "ddp", ParallelPlan(dp_replicate=2), "dp_replicate"),
               ("fsdp", "fsdp", ParallelPlan(dp_shard=2), "dp_shard")]
    if args.tuned_hand:
        configs.insert(1, ("ddp, hand as tuned", "ddp", ParallelPlan(dp_replicate=2), "dp_replicate"))
    for label, kind, plan, name in configs:
        torch.manual_seed(0)
        session = get_training_backend("torch_native").prepare(
            LM(args.vocab, args.dim, args.depth), plan=plan,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), admission="unverified",
            audit=None if args.audit else False,  # the audit's own cost: benchmarks/sdc_audit_overhead.py
            health=not args.no_health)  # health receipts (and the heartbeat) are on by default
        torch.manual_seed(0)
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=(name,))
        model, opt = hand_written(kind, LM(args.vocab, args.dim, args.depth), mesh, bucket_view="tuned" in label)

        def hand_step(model: nn.Module = model, opt: torch.optim.Optimizer = opt) -> None:
            loss = F.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        def session_step(session: object = session) -> None:
            session.train_batch(x, y)  # type: ignore[attr-defined]

        times = {"hand": [], "session": []}
        for _ in range(args.warmup):
            hand_step(), session_step()
        block = 5
        for i in range(0, args.steps, block):
            for which, fn in (("hand", hand_step), ("session", session_step)) if i % 2 == 0 else (
                    ("session", session_step), ("hand", hand_step)):
                for _ in range(block):
                    dist.barrier()
                    t0 = time.perf_counter()
                    fn()
                    times[which].append(time.perf_counter() - t0)
        hand, sess = statistics.median(times["hand"]), statistics.median(times["session"])
        rows.append((label, len(times["hand"]), hand * 1e3, sess * 1e3, sess / hand))
        session.close()
    return rows


def add_step_arguments(parser: argparse.ArgumentParser, *, steps: int) -> None:
    """The step count, warm-up and model/batch sizes shared by the training-step benchmarks."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(parser, steps=40)
    parser.add_argument("--audit", action="store_true", help="keep the session's default SDC audit on")
    parser.add_argument("--no-health", action="store_true", help="turn the session's health receipts off")
    parser.add_argument("--tuned-hand", action="store_true",
                        help="add a DDP row whose hand loop also keeps gradients as bucket views")
    args = parser.parse_args()
    if args.steps < 30:
        parser.error("--steps must be >= 30 so the median is meaningful")
    rows = run_world(worker, 2, args, timeout=3600.0)[0]
    print(f"world 2 (gloo, CPU), dim={args.dim} depth={args.depth} vocab={args.vocab} "
          f"batch={args.batch}x{args.seq} per rank, {args.warmup} warm-up steps, "
          f"SDC audit {'on (default rate)' if args.audit else 'off'}, health {'off' if args.no_health else 'on'}")
    print(f"{'transform':<20}{'steps':>7}{'hand ms':>10}{'session ms':>12}{'ratio':>8}")
    for label, n, hand, sess, ratio in rows:
        print(f"{label:<20}{n:>7}{hand:>10.2f}{sess:>12.2f}{ratio:>8.3f}")


if __name__ == "__main__":
    main()
