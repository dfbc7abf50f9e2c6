"""Signed megatron checkpoints in a real gloo world: round trip, swaps between check and use, foreign generations.

Runs inside a spawned rank (``run_world``); each swap happens for real, by wrapping the step that follows
the check and replacing the file on disk there (as tests/torch/test_checkpoint_swaps.py does).
"""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ._scenarios import HID, LR, _moments, mlp, mse


class _Payload:
    """A pickle that touches a marker file when unpickled (stands in for arbitrary code)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.touch, (Path(self.marker),))


def _session(seed: int) -> Any:
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend

    backend = get_training_backend("megatron")
    session = backend.prepare(mlp(), plan=ParallelPlan(), loss_fn=mse, activation_shape=(HID,), optimizer="adam",
                              lr=LR, admission="unverified")
    g = torch.Generator().manual_seed(seed)
    for _ in range(2):
        session.train_batch(torch.randn(4, 4, generator=g), torch.randn(4, 3, generator=g))
    return session


def _tensors(session: Any) -> dict[str, torch.Tensor]:
    out = {k: v.detach().clone() for k, v in session.stage.state_dict().items()}
    out.update({f"moment.{k}": v for k, v in _moments(session).items()})
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def _attempt(root: Path, **options: Any) -> dict[str, Any]:
    """Load ``root`` into a fresh session; report the error (if any) and whether the session was changed."""
    fresh = _session(seed=99)
    before = _tensors(fresh)
    try:
        info = fresh.load_checkpoint(str(root), **options)
        outcome: dict[str, Any] = {"error": None, "step": info["step"]}
    except Exception as err:  # noqa: BLE001 - the scenario reports it to the test
        outcome = {"error": f"{type(err).__name__}: {err}"}
    outcome["unchanged"] = _same(before, _tensors(fresh))
    outcome["tensors"] = _tensors(fresh)
    fresh.close()
    return outcome


def _swapping(owner: Any, name: str, target: Path, data: bytes) -> Callable[[], None]:
    """Replace ``owner.name`` by a wrapper that writes ``data`` to ``target`` first; returns the undo."""
    real = getattr(owner, name)

    def swapping(*args: Any, **kwargs: Any) -> Any:
        target.write_bytes(data)
        return real(*args, **kwargs)

    setattr(owner, name, swapping)
    return lambda: setattr(owner, name, real)


def _swap_attack(gen: Path, rel: str, data: bytes, owner: Any, name: str, root: Path) -> dict[str, Any]:
    original = (gen / rel).read_bytes()
    undo = _swapping(owner, name, gen / rel, data)
    try:
        return _attempt(root)
    finally:
        undo()
        (gen / rel).write_bytes(original)


def _save(seed: int, root: Path) -> dict[str, torch.Tensor]:
    session = _session(seed)
    session.save_checkpoint(str(root))
    saved = _tensors(session)
    session.close()
    return saved


def checkpoint_body(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """Every megatron checkpoint attack in one world-1 process; the test reads the outcomes."""
    warnings.filterwarnings("ignore")
    from megatron.core import dist_checkpointing

    from mixle_parallel.executors.megatron import checkpoint_verified as cv

    os.environ["MIXLE_PARALLEL_HOME"] = str(Path(tmp) / "home")
    root, other = Path(tmp) / "ours", Path(tmp) / "theirs"
    saved, theirs = _save(1, root), _save(2, other)
    gen, dcp = root / "gen-00000001", root / "gen-00000001" / "dcp"
    marker = Path(tmp) / "pwned"
    shard = sorted(p.name for p in dcp.glob("*.distcp"))[0]
    out: dict[str, Any] = {"files": sorted(p.relative_to(gen).as_posix() for p in gen.rglob("*") if p.is_file())}
    loaded = _attempt(root)
    out["roundtrip"] = {"error": loaded["error"], "step": loaded.get("step"), "equal": _same(loaded["tensors"], saved)}
    evil = pickle.dumps(_Payload(str(marker)))
    # .metadata / a shard swapped after the signature and manifest checks, just before DCP reads them
    out["metadata_swap"] = _swap_attack(gen, "dcp/.metadata", evil, cv, "load_state_dict", root)
    foreign = (other / "gen-00000001" / "dcp" / shard).read_bytes()
    out["shard_swap"] = _swap_attack(gen, f"dcp/{shard}", foreign, cv, "load_state_dict", root)
    # common.pt swapped after its check, before megatron's load: megatron only ever sees the checked bytes
    out["common_swap_late"] = _swap_attack(gen, "dcp/common.pt", evil, dist_checkpointing, "load", root)
    out["common_swap_late"]["equal"] = _same(out["common_swap_late"]["tensors"], saved)
    out["common_swap_early"] = _swap_attack(gen, "dcp/common.pt", evil, cv, "_locate_and_read", root)
    out["marker"] = marker.exists()
    # an unsigned generation; then another run's generation copied over ours
    signature = (gen / "MANIFEST.sig").read_bytes()
    (gen / "MANIFEST.sig").unlink()
    out["unsigned"] = _attempt(root)
    out["unsigned_opt_out"] = _attempt(root, trust="unsigned")
    out["unsigned_opt_out"]["equal"] = _same(out["unsigned_opt_out"]["tensors"], saved)
    (gen / "MANIFEST.sig").write_bytes(signature)
    shutil.rmtree(gen)
    shutil.copytree(other / "gen-00000001", gen)  # with its own, consistent pointer: the whole generation swapped
    shutil.copy(other / "LATEST", root / "LATEST")
    out["foreign"] = _attempt(root)
    out["foreign_on_purpose"] = _attempt(root, allow_rollback=True)
    out["foreign_on_purpose"]["equal"] = _same(out["foreign_on_purpose"]["tensors"], theirs)
    out["plain"] = _attempt(dcp)  # megatron's own folder, no signed generation around it
    rolled = Path(tmp) / "rolled"
    _save(3, rolled)
    first_pointer = (rolled / "LATEST").read_bytes()
    _save(4, rolled)
    (rolled / "LATEST").write_bytes(first_pointer)  # LATEST rolled back to generation 1
    out["rollback"] = _attempt(rolled)
    for result in out.values():
        if isinstance(result, dict):
            result.pop("tensors", None)
    return out
