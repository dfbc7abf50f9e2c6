"""The one process-world spawner on real gloo ranks: results by rank, progress, failures named."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")

from mixle_parallel.verification.harness.mesh import MeshError, report, run_world  # noqa: E402


def _sum_of_ranks(rank: int, world_size: int, scale: float) -> dict[str, Any]:
    import torch.distributed as dist

    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    report(("rank", rank))
    return {"rank": rank, "world": world_size, "backend": dist.get_backend(), "sum": value * scale}


def _fails_on_rank_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one refuses on purpose")
    return rank


def test_results_come_back_by_rank_with_progress_messages() -> None:
    messages: list[tuple[int, Any]] = []
    ranks = run_world(_sum_of_ranks, 2, 10.0, backend="gloo", timeout=300.0,
                      on_message=lambda rank, message: messages.append((rank, message)))
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 for r in ranks)
    assert all(r["backend"] == "gloo" for r in ranks)
    assert all(torch.equal(r["sum"], torch.tensor([30.0])) for r in ranks)  # (1 + 2) * 10, by value
    assert sorted(messages) == [(0, ("rank", 0)), (1, ("rank", 1))]


def test_a_failing_rank_raises_with_its_traceback() -> None:
    with pytest.raises(MeshError, match=r"rank 1 failed:(.|\n)*ValueError: rank one refuses on purpose"):
        run_world(_fails_on_rank_one, 2, timeout=300.0)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"world_size": 0}, "world_size must be an int >= 1"),
    ({"world_size": 2, "start_method": "fork"}, "start_method='fork'"),
    ({"world_size": 2, "timeout": 0}, "timeout must be > 0"),
    ({"world_size": 2, "preload": ["torch"]}, "preload= needs start_method='forkserver'"),
])
def test_bad_arguments_are_refused_before_any_process_starts(kwargs: dict[str, Any], match: str) -> None:
    world_size = kwargs.pop("world_size")
    with pytest.raises(ValueError, match=match):
        run_world(_fails_on_rank_one, world_size, **kwargs)
