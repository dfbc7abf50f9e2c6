"""mixle's ``dcp_checkpoint`` names over our checkpoint machinery (``executors.torch.checkpoint``).

Every save is a verified, atomically published generation (manifest, pointer, JSON for all
non-tensor state, DCP only for tensors); every load, ``load_training_metadata`` included, verifies
it (signature, lineage, high-water mark) before anything is read or changed and
reshards through DCP when the world size changed (``allow_world_size_change=True``), re-deriving
the rank-local state by the rule in docs/checkpoints.md. What mixle keeps in its sidecar (step,
scheduler, scaler, parallel plan, extra) is kept under the same names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from ...contracts import ParallelPlan, from_dict, to_dict
from .checkpoint import (
    CheckpointHandle,
    _from_json,
    _group,
    _read_documents,
    load_checkpoint,
    save_checkpoint,
)
from .checkpoint_manifest import STATE_NAME, CorruptCheckpointError
from .checkpoint_trust import CHECKPOINT_TRUST_MODES, locate_generation


def _extra(scaler: Any, parallel_plan: Any, extra: dict[str, Any] | None) -> dict[str, Any]:
    if parallel_plan is not None and not isinstance(parallel_plan, ParallelPlan):
        raise TypeError(f"parallel_plan must be a ParallelPlan or None, got {type(parallel_plan).__name__}")
    return {"user": extra, "scaler": scaler.state_dict() if scaler is not None else None,
            "parallel_plan": to_dict(parallel_plan) if parallel_plan is not None else None}


def _save(module: Any, optimizer: Any, path: str, *, step: int, asynchronous: bool = False,
          state_dicts: tuple[dict[str, Any], dict[str, Any]] | None = None, scheduler: Any = None,
          scaler: Any = None, loader_state: Any = None, parallel_plan: Any = None,
          typed_scheduler_state: Any = None, extra: dict[str, Any] | None = None) -> CheckpointHandle:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return save_checkpoint(path, model=module, optimizer=optimizer, scheduler=scheduler,
                           session_state={"step": step}, loader_state=loader_state,
                           typed_scheduler_state=typed_scheduler_state, extra=_extra(scaler, parallel_plan, extra),
                           asynchronous=asynchronous, state_dicts=state_dicts)


def save_training_state(module: Any, optimizer: Any, path: str, *, step: int, scheduler: Any = None,
                        scaler: Any = None, loader_state: Any = None, parallel_plan: Any = None,
                        typed_scheduler_state: Any = None, extra: dict[str, Any] | None = None) -> None:
    """Save complete, reshardable training state as a new published generation under ``path`` (collective)."""
    _save(module, optimizer, path, step=step, scheduler=scheduler, scaler=scaler, loader_state=loader_state,
          parallel_plan=parallel_plan, typed_scheduler_state=typed_scheduler_state, extra=extra)


def save_frozen_training_state(model_state: dict[str, Any], optimizer_state: dict[str, Any], path: str, *,
                               step: int, loader_state: Any = None, parallel_plan: Any = None,
                               typed_scheduler_state: Any = None, extra: dict[str, Any] | None = None) -> None:
    """Save already-taken model and optimizer state dicts (``get_state_dict``'s) the same way."""
    _save(None, None, path, step=step, state_dicts=(model_state, optimizer_state), loader_state=loader_state,
          parallel_plan=parallel_plan, typed_scheduler_state=typed_scheduler_state, extra=extra)


def save_sharded(module: Any, optimizer: Any, path: str) -> None:
    """Save the sharded model and optimizer (each rank its shard) as a generation at step 0."""
    save_training_state(module, optimizer, path, step=0)


def load_sharded(module: Any, optimizer: Any, path: str) -> None:
    """Load a generation into ``module`` and ``optimizer`` in place (resharding when the world changed)."""
    load_training_state(module, optimizer, path, allow_world_size_change=True)


def _payload(state: dict[str, Any], loaded: dict[str, Any] | None, loader_state: Any, saved_world: int,
             ) -> dict[str, Any]:
    extra = state["extra"] if isinstance(state.get("extra"), dict) else {}
    plan = extra.get("parallel_plan")
    session = state["session_state"] or {}
    return {"step": session.get("step", 0), "scheduler": state.get("scheduler"), "scaler": extra.get("scaler"),
            "parallel_plan": from_dict(plan, ParallelPlan) if plan else None, "extra": extra.get("user"),
            "loader_state": loader_state, "typed_scheduler_state": state.get("typed_scheduler_state"),
            "saved_world_size": saved_world, **({"rng": loaded["rng"]} if loaded else {})}


def load_training_metadata(path: str, *, rank_local_transform: Any = None, trust: str = "signed",
                           allow_rollback: bool = False) -> dict[str, Any]:
    """The verified non-tensor state of the published generation (this rank's loader state; re-derived by
    the documented rule when the world size changed), without touching any model.

    Verified as ``load_checkpoint`` verifies (``checkpoint_trust.locate_generation``: trusted signature, lineage,
    the run's high-water mark; ``trust="unsigned"`` and ``allow_rollback=True`` are the same opt-outs), then every
    document is read once from bytes checked against the signed manifest. Not collective: each calling rank
    verifies for itself.
    """
    _check_transform(rank_local_transform)
    if trust not in CHECKPOINT_TRUST_MODES:
        raise ValueError(f"trust={trust!r}; expected one of {CHECKPOINT_TRUST_MODES}")
    _, rank, world = _group(None)
    gen_dir, digest = locate_generation(Path(path), trust=trust, allow_rollback=allow_rollback)
    try:
        state, _, loader_state, saved_world, _ = _read_documents(gen_dir, digest, rank, world, True)
        decoded = {k: _from_json(state.get(k), k) for k in ("session_state", "scheduler", "typed_scheduler_state",
                                                             "extra")}
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # valid JSON of the wrong shape
        raise CorruptCheckpointError(gen_dir / STATE_NAME, f"unreadable state ({type(err).__name__}: {err})") \
            from None
    return _payload(decoded, None, loader_state, saved_world)


def load_training_state(module: Any, optimizer: Any, path: str, *, scheduler: Any = None, scaler: Any = None,
                        restore_rng: bool = True, allow_world_size_change: bool = False,
                        rank_local_transform: Any = None, trust: str = "signed",
                        allow_rollback: bool = False) -> dict[str, Any]:
    """Verify and restore the published generation into ``module``/``optimizer`` (collective); returns the
    metadata (step, scheduler, scaler, parallel_plan, extra, loader_state, typed_scheduler_state, rng).

    Verification is ``load_checkpoint``'s (``trust="unsigned"`` / ``allow_rollback=True`` are its opt-outs)."""
    _check_transform(rank_local_transform)
    if not restore_rng:
        raise ValueError("restore_rng=False is not offered: RNG is restored (or re-derived on a world-size "
                         "change) so a resumed run draws what an uninterrupted one would")
    loaded = load_checkpoint(path, model=module, optimizer=optimizer, scheduler=scheduler,
                             allow_world_size_change=allow_world_size_change, trust=trust,
                             allow_rollback=allow_rollback)
    extra = loaded["extra"] if isinstance(loaded["extra"], dict) else {}
    if scaler is not None and extra.get("scaler") is not None:
        scaler.load_state_dict(extra["scaler"])
    state = {"session_state": loaded["session_state"], "scheduler": None, "extra": extra,
             "typed_scheduler_state": loaded["typed_scheduler_state"]}
    return _payload(state, loaded, loaded["loader_state"], loaded["saved_world_size"])


def _check_transform(rank_local_transform: Any) -> None:
    if rank_local_transform is not None:
        raise TypeError(
            "rank_local_transform is not taken: on a world-size change the rank-local state is re-derived by "
            "one documented rule (docs/checkpoints.md: loader state common to all saved ranks, RNG seeds "
            "derived per new rank); save a world-size-free loader position (epoch, samples consumed)"
        )


@attrs.define
class AsyncTrainingCheckpoint:
    """An asynchronous save in flight: ``wait()`` (collective) returns once the generation is published."""

    handle: CheckpointHandle
    path: Path

    def wait(self) -> None:
        """Block until written and published; raises if the write failed."""
        self.handle.wait()

    @property
    def done(self) -> bool:
        """True once the write completed."""
        return self.handle.done()


def async_save_training_state(module: Any, optimizer: Any, path: str, *, step: int, scheduler: Any = None,
                              scaler: Any = None, loader_state: Any = None, parallel_plan: Any = None,
                              typed_scheduler_state: Any = None, extra: dict[str, Any] | None = None,
                              ) -> AsyncTrainingCheckpoint:
    """Stage the state now and write it in the background; training may go on until ``wait()``."""
    handle = _save(module, optimizer, path, step=step, asynchronous=True, scheduler=scheduler, scaler=scaler,
                   loader_state=loader_state, parallel_plan=parallel_plan,
                   typed_scheduler_state=typed_scheduler_state, extra=extra)
    return AsyncTrainingCheckpoint(handle, Path(path))


__all__ = [
    "AsyncTrainingCheckpoint", "async_save_training_state", "load_sharded", "load_training_metadata",
    "load_training_state", "save_frozen_training_state", "save_sharded", "save_training_state",
]
