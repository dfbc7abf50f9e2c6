"""Receipts after a resume: the step clock continues from the checkpoint and the first commit is marked a restart."""

from __future__ import annotations

import pathlib

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")


def test_first_commit_after_load_is_marked_a_restart(tmp_path: pathlib.Path) -> None:
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    def session() -> object:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        return get_training_backend("torch_native").prepare(model, plan=ParallelPlan(), optimizer="SGD", lr=0.1,
                                                         health={"peak_flops_per_sec": 1e9})  # no peak measuring

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 4, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(4)]
    first = session()
    receipts = [first.train_batch(x, y) for x, y in batches[:2]]
    first.save_checkpoint(str(tmp_path / "ck"), loader_state={"samples_consumed": 8})
    receipts.append(first.train_batch(*batches[2]))  # trained, then lost with the process
    first.close()
    resumed = session()
    assert resumed.load_checkpoint(str(tmp_path / "ck"))["loader_state"] == {"samples_consumed": 8}
    receipts += [resumed.train_batch(x, y) for x, y in batches[2:]]
    resumed.close()
    assert [r.step for r in receipts] == [1, 2, 3, 3, 4]  # the resumed clock picks up at the checkpoint
    assert [r.extra["health"]["restart"] for r in receipts] == [False, False, False, True, False]
    assert receipts[3].loss == pytest.approx(receipts[2].loss, rel=1e-6)  # step 3 redone from the same state
