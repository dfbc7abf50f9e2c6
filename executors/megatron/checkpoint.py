"""Save and load a MegatronSession with megatron-core's dist_checkpointing (reshardable).

Every tensor is saved under its stage-independent name (``layers.<global layer index>...``) as
a ``ShardedTensor``: megatron's tensor-parallel layers describe their own shards, every other
tensor is marked replicated across tp and dp. A checkpoint written under one plan therefore
loads under another plan of the same model (different pp cut, tp, or dp). Optimizer state
(Adam moments) follows its parameters; optimizer hyper-parameters come from the live session.

``path`` is a checkpoint root: each save is a new signed generation under it and a load verifies the
published one before megatron reads a byte of it (``checkpoint_verified``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .stages import PipelineStage


def _module_sharded_state_dict(module: torch.nn.Module, prefix: str) -> dict[str, Any]:
    """Megatron modules describe their shards; plain modules recurse, their own tensors replicated."""
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    if hasattr(module, "sharded_state_dict"):  # hasattr does not narrow: Module.__getattr__ is Tensor | Module
        return dict(module.sharded_state_dict(prefix=prefix))  # type: ignore[operator]  # torch stubs: Tensor | Module
    out: dict[str, Any] = {}
    own: dict[str, torch.Tensor] = {name: p for name, p in module.named_parameters(recurse=False)}
    own.update({name: b for name, b in module.named_buffers(recurse=False) if b is not None})
    if own:
        out.update(make_sharded_tensors_for_checkpoint(own, prefix))
    for name, child in module.named_children():
        out.update(_module_sharded_state_dict(child, f"{prefix}{name}."))
    return out


def model_sharded_state_dict(stage: PipelineStage) -> dict[str, Any]:
    """The stage's parameters as ShardedTensors keyed by their global (stage-independent) names."""
    out: dict[str, Any] = {}
    for index, layer in stage.layers.items():
        out.update(_module_sharded_state_dict(layer, f"layers.{index}."))
    return out


def _state(stage: PipelineStage, optimizer: Any, *, loading: bool) -> dict[str, Any]:
    model = model_sharded_state_dict(stage)
    optimizer = optimizer.sharded_state_dict(model, is_loading=loading)
    return {"model": model, "optimizer": _without_param_groups(optimizer)}


def _without_param_groups(state: Any) -> Any:
    """Drop param_groups (they list this layout's parameter ids); the live optimizer keeps its own."""
    if isinstance(state, dict):
        return {k: _without_param_groups(v) for k, v in state.items() if k != "param_groups"}
    if isinstance(state, list):
        return [_without_param_groups(v) for v in state]
    return state


def save_stage(stage: PipelineStage, optimizer: Any, path: str, *, step: int, plan: Any) -> None:
    """Write a session's stage, optimizer state and step clock as a new signed generation under the root
    ``path`` and publish it (collective)."""
    from megatron.core import dist_checkpointing

    from .checkpoint_verified import begin_generation, finish_generation  # imports megatron-core

    root = Path(path)
    gen_dir, lineage = begin_generation(root)
    state = _state(stage, optimizer, loading=False)
    state["session"] = {"step": step, "plan": repr(plan)}
    dist_checkpointing.save(state, str(gen_dir / "dcp"))
    finish_generation(root, gen_dir, lineage)


def load_stage(stage: PipelineStage, optimizer: Any, path: str, *, trust: str = "signed",
               allow_rollback: bool = False) -> dict[str, Any]:
    """Verify the generation ``path`` designates, then fill a session's stage and optimizer from its checked
    bytes, resharding to its plan; return the clocks."""
    from .checkpoint_verified import verified_load  # imports megatron-core

    template = _state(stage, optimizer, loading=True)
    template["session"] = {"step": 0, "plan": ""}
    loaded = verified_load(template, path, trust=trust, allow_rollback=allow_rollback)
    _copy_into(template["model"], loaded["model"])
    optimizer_state = optimizer.state_dict()
    _merge_state(optimizer_state, loaded["optimizer"])
    optimizer.load_state_dict(optimizer_state)
    return {"step": int(loaded["session"]["step"]), "saved_plan": loaded["session"]["plan"]}


def _copy_into(template: dict[str, Any], loaded: dict[str, Any]) -> None:
    with torch.no_grad():
        for key, sharded in template.items():
            value = loaded[key]
            target = sharded.data if hasattr(sharded, "data") else sharded
            if isinstance(target, torch.Tensor) and target.data_ptr() != value.data_ptr():
                target.copy_(value)


def _merge_state(live: Any, loaded: Any) -> None:
    """Overwrite the live optimizer state dict's per-parameter entries with the loaded ones."""
    if isinstance(live, dict) and isinstance(loaded, dict):
        for key, value in loaded.items():
            if key in live and isinstance(live[key], (dict, list)) and not isinstance(value, torch.Tensor):
                _merge_state(live[key], value)
            else:
                live[key] = value
