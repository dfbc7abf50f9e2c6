"""Signed generations for megatron checkpoints, loaded only from bytes checked against the signed manifest.

A save writes megatron's ``dist_checkpointing`` files into ``<root>/gen-N/dcp/`` and rank 0 then hashes every
file of the generation into ``MANIFEST.json``, signs it with the run id, generation number and previous
manifest digest (``executors.torch.checkpoint_trust``: the same predicate as torch_native) and publishes it.

megatron-core 0.16.1 reads a checkpoint by path: ``maybe_load_config`` opens ``metadata.json``,
``TorchCommonLoadStrategy.load_common`` does ``torch.load`` of ``common.pt`` (a full unpickler) and
``TorchDistLoadShardedStrategy.load`` builds its own ``FileSystemReader`` (``.metadata`` is a pickle). A load
here first verifies the signature and lineage (``_locate``, as torch_native), then hands megatron strategies
that read each file once through ``read_verified``: ``common.pt`` with ``torch.load(weights_only=True)`` from
the checked bytes, DCP's files through ``VerifiedReader``, and ``metadata.json`` as a checked copy in a private
temporary folder (the only path megatron is given).
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy
from megatron.core.dist_checkpointing.strategies.torch import (
    MCoreLoadPlanner,
    TorchDistLoadShardedStrategy,
    _replace_sharded_keys_with_state_dict_keys,
    _replace_state_dict_keys_with_sharded_keys,
    _restore_dict_types,
    _unwrap_pyt_sharded_tensor,
    mcore_to_pyt_state_dict,
)
from megatron.core.dist_checkpointing.utils import nested_values
from torch.distributed.checkpoint import load_state_dict

from ..torch.checkpoint import _agree, _all_gather_text, _locate
from ..torch.checkpoint_manifest import (
    DCP_DIR,
    CheckpointError,
    CorruptCheckpointError,
    parse_json,
    publish,
    read_manifest,
    read_verified,
    write_manifest,
)
from ..torch.checkpoint_reader import VerifiedReader
from ..torch.checkpoint_trust import CHECKPOINT_TRUST_MODES, Lineage, open_generation, sign_generation

__all__ = ["begin_generation", "finish_generation", "verified_load"]

CONFIG_NAME = "metadata.json"
COMMON_NAME = "common.pt"
_BACKENDS = {"sharded_backend": "torch_dist", "common_backend": "torch"}


def _world() -> tuple[Any, int, int]:
    return dist.group.WORLD, dist.get_rank(), dist.get_world_size()


def begin_generation(root: Path) -> tuple[Path, Lineage | None]:
    """Collective: rank 0 creates the next generation folder (continuing the run ``LATEST`` names); every rank
    gets its ``dcp`` folder, where megatron writes. Rank 0 also returns the lineage it will sign."""
    pg, rank, world = _world()
    error: BaseException | None = None
    name, lineage = "", None
    if rank == 0:
        try:
            name, lineage = open_generation(root)
        except (OSError, CheckpointError) as err:
            error = CheckpointError(f"cannot create a checkpoint generation under {root}: {err}")
    _agree(error, pg, world, what=f"creating a checkpoint generation under {root}")
    return root / _all_gather_text(name, pg, world)[0], lineage


def finish_generation(root: Path, gen_dir: Path, lineage: Lineage | None) -> None:
    """Collective, after megatron's save on every rank: rank 0 hashes, signs and publishes the generation."""
    pg, rank, world = _world()
    dist.barrier()
    error: BaseException | None = None
    if rank == 0 and lineage is not None:
        try:
            digest = write_manifest(gen_dir, world_size=world, info={"torch_version": torch.__version__,
                                                                      "writer": "megatron dist_checkpointing"})
            sign_generation(gen_dir, digest, lineage)  # before publishing: a reader never sees an unsigned LATEST
            publish(root, gen_dir.name, digest)
        except (OSError, CheckpointError) as err:
            error = CheckpointError(f"cannot publish checkpoint generation {gen_dir}: {err}")
    _agree(error, pg, world, what=f"publishing checkpoint generation {gen_dir}")


class VerifiedCommonStrategy(TorchCommonLoadStrategy):
    """``common.pt`` from its checked bytes through the restricted unpickler; nothing else by path."""

    def __init__(self, gen_dir: Path, data: bytes) -> None:
        super().__init__()
        self._path, self._data = gen_dir / DCP_DIR / COMMON_NAME, data

    def load_common(self, checkpoint_dir: Any) -> Any:
        """The common state dict, unpickled (tensors and plain containers only) from the checked bytes."""
        try:
            return torch.load(io.BytesIO(self._data), map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - the restricted unpickler refuses anything but data
            raise CorruptCheckpointError(self._path, f"not loadable with weights_only=True ({type(err).__name__})"
                                         ) from None

    def load_sharded_objects(self, sharded_objects_state_dict: Any, checkpoint_dir: Any) -> Any:
        """Refused: megatron would ``torch.load`` each object file by path (torch_dist holds them itself)."""
        raise CheckpointError("this checkpoint asks for separate sharded-object files, which megatron reads by "
                              "path; only torch_dist checkpoints written by this release are loaded")


class VerifiedShardedStrategy(TorchDistLoadShardedStrategy):
    """megatron's torch_dist load, with DCP reading through ``VerifiedReader`` instead of a path reader."""

    def __init__(self, reader: VerifiedReader) -> None:
        super().__init__()
        self.reader = reader

    def load(self, sharded_state_dict: Any, checkpoint_dir: Any) -> Any:
        """``TorchDistLoadShardedStrategy.load`` (megatron-core 0.16.1) with the verified reader."""
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        tensors = [t for t in nested_values(sharded_state_dict) if isinstance(t, ShardedTensor)]
        original = sharded_state_dict
        sharded_state_dict, flat, renamed = _replace_state_dict_keys_with_sharded_keys(sharded_state_dict)
        pyt_state_dict = mcore_to_pyt_state_dict(sharded_state_dict, True)
        planner = MCoreLoadPlanner(
            shapes_validation_sharded_tensors=[t for t in tensors if not t.allow_shape_mismatch],
            allow_shape_mismatch_sharded_tensors={t.key: t for t in tensors if t.allow_shape_mismatch})
        load_state_dict(pyt_state_dict, self.reader, planner=planner)
        loaded = {k: _unwrap_pyt_sharded_tensor(v) for k, v in pyt_state_dict.items()}
        loaded = _replace_sharded_keys_with_state_dict_keys(loaded, flat, renamed)
        _restore_dict_types(loaded, original)
        return loaded


def _checked_config(gen_dir: Path, manifest: Mapping[str, Any]) -> bytes:
    """``metadata.json``'s checked bytes, refused unless it names the torch_dist + torch backends."""
    path = gen_dir / DCP_DIR / CONFIG_NAME
    data = read_verified(gen_dir, manifest, f"{DCP_DIR}/{CONFIG_NAME}")
    config = parse_json(data, path, what="megatron metadata")  # the one strict parser; a non-object is refused
    if any(config.get(k) != v for k, v in _BACKENDS.items()):
        raise CorruptCheckpointError(path, f"names backends other than {_BACKENDS}")
    return data


def _locate_and_read(path: Path, trust: str, allow_rollback: bool) -> tuple[Path, dict[str, Any], bytes, bytes]:
    """Collective: the signed generation (signature and lineage checked on rank 0), its manifest, and the checked
    bytes of ``metadata.json`` and ``common.pt`` (every rank agrees before megatron's collective load starts)."""
    pg, rank, world = _world()
    gen_dir, digest = _locate(path, trust=trust, allow_rollback=allow_rollback, pg=pg, world=world, rank=rank)
    error: BaseException | None = None
    manifest: dict[str, Any] = {}
    config = common = b""
    try:
        manifest = read_manifest(gen_dir, digest)
        config = _checked_config(gen_dir, manifest)
        common = read_verified(gen_dir, manifest, f"{DCP_DIR}/{COMMON_NAME}")
    except Exception as err:  # noqa: BLE001 - every rank must learn of it
        error = err
    _agree(error, pg, world, what=f"verifying checkpoint {gen_dir}")
    return gen_dir, manifest, config, common


def verified_load(template: dict[str, Any], path: str, *, trust: str = "signed",
                  allow_rollback: bool = False) -> dict[str, Any]:
    """Collective: verify the generation ``path`` designates, then let megatron load ``template`` from checked
    bytes only. Nothing in the template is written when a check fails (every rank agrees first)."""
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException

    if trust not in CHECKPOINT_TRUST_MODES:
        raise ValueError(f"trust={trust!r}; expected one of {CHECKPOINT_TRUST_MODES}")
    pg, _, world = _world()
    gen_dir, manifest, config, common = _locate_and_read(Path(path), trust, allow_rollback)
    agree: Callable[[BaseException | None], None] = \
        lambda err: _agree(err, pg, world, what=f"checking the tensor files of checkpoint {gen_dir}")  # noqa: E731
    reader = VerifiedReader(gen_dir, manifest, DCP_DIR, agree)
    error: BaseException | None = None
    loaded: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mixle-megatron-ckpt-") as private:
        (Path(private) / CONFIG_NAME).write_bytes(config)  # megatron's only by-path read: a checked copy
        try:
            loaded = dist_checkpointing.load(template, private, sharded_strategy=VerifiedShardedStrategy(reader),
                                             common_strategy=VerifiedCommonStrategy(gen_dir, common))
        except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP wraps the reader's refusal
            error = reader.failure or err
    _agree(error, pg, world, what=f"loading checkpoint {gen_dir}")
    return loaded
