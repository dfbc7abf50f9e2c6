"""Reshardable, atomically published training checkpoints through torch.distributed.checkpoint.

What is saved: the model and optimizer state (``get_state_dict``: DTensor shards for FSDP2/TP
models, plain tensors otherwise), the LR scheduler's ``state_dict()``, the session clocks, the
typed scheduler state, ``extra``, every rank's RNG states (torch CPU, the current CUDA device's,
Python ``random``, NumPy's global generator) and every rank's loader state.

Where it goes (layout and publication: ``checkpoint_manifest``): tensors go through DCP into
``gen-N/dcp/`` and nothing else does — every non-tensor leaf of the model/optimizer state
(param-group hyper-parameters, FQN lists) and all other state is written by this module as JSON
(``state.json``, ``ranks/rank-R.json``). What DCP does inside: each tensor is serialized with
``torch.save`` into ``__R_0.distcp`` files and read back with ``torch.load(weights_only=True)``
(the restricted unpickler); its ``.metadata`` index is a ``pickle.dump`` of its ``Metadata``
dataclass, read with ``pickle.load``. Because only tensors reach DCP, its files hold no
user objects, and a load hands DCP only bytes it read once and checked against the signed
manifest (``checkpoint_reader.VerifiedReader``): nothing is reopened by path after its check.

Rank-local state rule (also in docs/checkpoints.md):

* Same world size: rank r restores exactly what rank r saved (RNG states, loader state).
* World size changed (only with ``allow_world_size_change=True``): model and optimizer tensors
  are resharded by DCP onto the new placements. RNG: rank r of the new world seeds torch (CPU
  and the current CUDA device), ``random`` and NumPy from
  ``derive_seed("mixle-parallel/rng", s0, step, r, W)`` — s0 is saved rank 0's
  ``torch.initial_seed()``, step is ``session_state["step"]`` (0 if absent), W the new world
  size — so streams are distinct per rank, reproducible, and independent of the old world size.
  Loader: every rank receives the loader state common to all saved ranks (a world-size-free
  global position such as epoch and samples consumed, from which each rank derives its shard
  by rank and world size); if saved ranks differ, the load is refused before anything changes.

Asynchronous saves stage (copy) the state synchronously, then DCP writes it on a background
thread over a dedicated gloo process group (so its collectives never interleave with the
training group's); training continues meanwhile; rank 0 publishes the manifest and pointer
when the write completes; ``handle.wait()`` (collective) returns once it is published.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ...contracts import SCHEMA_VERSION, TorchSessionState, from_dict, to_dict
from .checkpoint_manifest import (
    DCP_DIR,
    FORMAT,
    FORMAT_VERSION,
    STATE_NAME,
    CheckpointError,
    CorruptCheckpointError,
    WorldSizeChangeError,
    derive_seed,
    manifest_problems,
    parse_json,
    publish,
    rank_file,
    read_manifest,
    read_verified,
    rederived_loader_state,
    write_json_atomic,
    write_manifest,
)
from .checkpoint_marks import DamagedRecordError
from .checkpoint_reader import VerifiedReader
from .checkpoint_state import (
    _capture_rng,
    _from_json,
    _reseed_rng,
    _restore_rng,
    _shape_record,
    _split,
    _to_json,
)
from .checkpoint_trust import (
    CHECKPOINT_TRUST_MODES,
    Lineage,
    UntrustedCheckpointError,
    locate_generation,
    open_generation,
    sign_generation,
)

__all__ = ["CheckpointHandle", "load_checkpoint", "load_session", "save_checkpoint", "save_session"]

_OPTIONS = StateDictOptions(full_state_dict=False, cpu_offload=False, strict=True)
_IN_FLIGHT: list[CheckpointHandle] = []
_ASYNC_GROUPS: dict[tuple[int, tuple[int, ...]], Any] = {}


# ---- process-group plumbing -----------------------------------------------------------------
def _group(process_group: Any) -> tuple[Any, int, int]:
    """(group, rank in it, its size); (None, 0, 1) when torch.distributed is not initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        return None, 0, 1
    pg = process_group if process_group is not None else dist.group.WORLD
    return pg, dist.get_rank(pg), dist.get_world_size(pg)


@contextlib.contextmanager
def _single_process_quiet(pg: Any) -> Iterator[None]:
    """Silence DCP's 'assuming a single process' warning when that is exactly the intent."""
    with warnings.catch_warnings():
        if pg is None:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _comm_device(pg: Any) -> torch.device:
    backend = str(dist.get_backend(pg)).lower()
    if "gloo" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _all_gather_text(text: str, pg: Any, world: int) -> list[str]:
    """Every rank's ``text`` (UTF-8 bytes in uint8 tensors: no pickle, unlike all_gather_object)."""
    if pg is None:
        return [text]
    device, data = _comm_device(pg), text.encode("utf-8")
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=pg)
    longest = max(1, max(int(s.item()) for s in sizes))
    buffer = torch.zeros(longest, dtype=torch.uint8, device=device)
    if data:
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    gathered = [torch.empty_like(buffer) for _ in range(world)]
    dist.all_gather(gathered, buffer, group=pg)
    return [bytes(g[: int(n.item())].cpu().tolist()).decode("utf-8") for g, n in zip(gathered, sizes)]


def _error_doc(err: BaseException) -> dict[str, Any]:
    if isinstance(err, CorruptCheckpointError):
        return {"type": "corrupt", "path": err.path, "problem": err.problem}
    if isinstance(err, DamagedRecordError):
        return {"type": "damaged", "path": str(err.path), "problem": err.problem,
                "root": None if err.root is None else str(err.root)}
    kind = ("world" if isinstance(err, WorldSizeChangeError)
            else "untrusted" if isinstance(err, UntrustedCheckpointError) else "checkpoint")
    return {"type": kind, "message": f"{err}" if isinstance(err, CheckpointError)
            else f"{type(err).__name__}: {err}"}


def _agree(local_error: BaseException | None, pg: Any, world: int, *, what: str) -> None:
    """Collective: if any rank failed, raise the lowest rank's error on every rank."""
    text = json.dumps(_error_doc(local_error)) if local_error is not None else ""
    texts = _all_gather_text(text, pg, world)
    failed = [(rank, json.loads(t)) for rank, t in enumerate(texts) if t]
    if not failed:
        return
    rank, doc = failed[0]
    others = f" (ranks failing: {[r for r, _ in failed]})" if len(failed) > 1 else ""
    if doc["type"] == "corrupt":
        raise CorruptCheckpointError(doc["path"], doc["problem"] + others) from local_error
    if doc["type"] == "damaged":
        raise DamagedRecordError(Path(doc["path"]), f"{doc['problem']}{others}; found on rank {rank}",
                                 None if doc["root"] is None else Path(doc["root"])) from local_error
    cls = {"world": WorldSizeChangeError, "untrusted": UntrustedCheckpointError}.get(doc["type"], CheckpointError)
    raise cls(f"{what} failed on rank {rank}: {doc['message']}{others}") from local_error


def _async_group(pg: Any) -> Any:
    """A gloo group over the same ranks as ``pg``, created once, for DCP's background thread."""
    ranks = tuple(dist.get_process_group_ranks(pg))
    key = (id(dist.group.WORLD), ranks)
    if key not in _ASYNC_GROUPS:
        _ASYNC_GROUPS[key] = dist.new_group(list(ranks), backend="gloo", use_local_synchronization=True)
    return _ASYNC_GROUPS[key]


def _state_dicts(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model and optimizer state dicts keyed by FQN, without creating optimizer state as a side effect."""
    fresh = not optimizer.state
    msd, osd = get_state_dict(model, optimizer, options=_OPTIONS)
    if fresh:  # get_state_dict initialized the state with a zero-lr step; undo that
        optimizer.state.clear()
        osd = {"state": {}, "param_groups": osd["param_groups"]}
    return msd, osd


# ---- save -----------------------------------------------------------------------------------
class CheckpointHandle:
    """A save in progress or done: ``wait()`` (collective) returns the published generation folder."""

    def __init__(self, generation_dir: Path, *, future: Future | None = None, pg: Any = None,
                 rank: int = 0, world: int = 1, finalize: Any = None) -> None:
        self.path = generation_dir
        self.generation = generation_dir.name
        self._future, self._pg, self._rank, self._world = future, pg, rank, world
        self._published = threading.Event()
        self._finalize_error: BaseException | None = None
        self._waited = future is None
        if future is None:
            self._published.set()
        elif rank == 0:
            future.add_done_callback(lambda f: self._on_written(f, finalize))
        else:
            self._published.set()

    def _on_written(self, future: Future, finalize: Any) -> None:
        try:
            if future.exception() is None:
                finalize()
        except BaseException as err:  # noqa: BLE001 - reported by wait()
            self._finalize_error = err
        finally:
            self._published.set()

    def done(self) -> bool:
        """True once this rank's write finished and (on rank 0) the generation is published."""
        return self._waited or (self._future is not None and self._future.done() and self._published.is_set())

    def wait(self) -> Path:
        """Block until every rank's write is complete and the pointer names this generation."""
        if self._waited:
            return self.path
        assert self._future is not None  # a handle without a future starts out waited
        error: BaseException | None = None
        try:
            self._future.result()
        except BaseException as err:  # noqa: BLE001 - shared with every rank below
            error = err
        self._published.wait()
        error = error or self._finalize_error
        self._waited = True
        if self in _IN_FLIGHT:
            _IN_FLIGHT.remove(self)
        _agree(error, self._pg, self._world, what=f"asynchronous save of {self.path}")
        return self.path


def _drain_in_flight() -> None:
    while _IN_FLIGHT:
        _IN_FLIGHT[0].wait()


def _encode_state(model: Any, optimizer: Any, scheduler: Any, *, session_state: dict[str, Any], loader_state: Any,
                  typed_scheduler_state: Any, extra: Any, rank: int, world: int,
                  state_dicts: tuple[dict[str, Any], dict[str, Any]] | None,
                  ) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """(tensors for DCP, the global JSON document, this rank's JSON document) of the state to save."""
    msd, osd = state_dicts if state_dicts is not None else _state_dicts(model, optimizer)
    model_json, model_tensors = _split(msd, "model")
    optim_json, optim_tensors = _split(osd, "optimizer")
    tensors = {**model_tensors, **optim_tensors}
    rank_doc = {"format": FORMAT, "version": FORMAT_VERSION, "kind": "rank", "rank": rank,
                "world_size": world, "rng": _to_json(_capture_rng(), "rng"),
                "loader_state": _to_json(loader_state, "loader_state")}
    global_doc = {"format": FORMAT, "version": FORMAT_VERSION, "kind": "state", "world_size": world,
                  "saved_unix": time.time(), "torch_version": torch.__version__,
                  "session_state": _to_json(dict(session_state), "session_state"),
                  "scheduler": _to_json(scheduler.state_dict(), "scheduler.state_dict()")
                  if scheduler is not None else None,
                  "typed_scheduler_state": _to_json(typed_scheduler_state, "typed_scheduler_state"),
                  "extra": _to_json(extra, "extra"), "model": model_json, "optimizer": optim_json,
                  "tensors": _shape_record(tensors)}
    return tensors, global_doc, rank_doc


def _new_generation(root: Path, global_doc: dict[str, Any], rank_doc: dict[str, Any], pg: Any, rank: int,
                    world: int) -> tuple[Path, Lineage | None]:
    """Collective: rank 0 creates the next generation folder with the global state; every rank writes its own.

    Rank 0 also returns the lineage the generation will be signed with (the run ``LATEST`` names, continued).
    """
    error: BaseException | None = None
    generation, lineage = "", None
    if rank == 0:
        try:
            generation, lineage = open_generation(root)
            write_json_atomic(root / generation / STATE_NAME, global_doc)
        except OSError as err:
            error = CheckpointError(f"cannot create a checkpoint generation under {root}: {err}")
    _agree(error, pg, world, what=f"creating a checkpoint generation under {root}")
    gen_dir = root / _all_gather_text(generation, pg, world)[0]
    try:
        write_json_atomic(rank_file(gen_dir, rank), rank_doc)
    except OSError as err:
        error = CheckpointError(f"cannot write {rank_file(gen_dir, rank)}: {err}")
    _agree(error, pg, world, what=f"writing rank-local state into {gen_dir}")
    return gen_dir, lineage


def _write_tensors(tensors: dict[str, torch.Tensor], root: Path, gen_dir: Path, lineage: Lineage | None, *,
                   asynchronous: bool, pg: Any, rank: int, world: int) -> CheckpointHandle:
    """DCP writes the tensors (now, or on a background thread); rank 0 then signs and publishes the generation."""
    def finalize() -> None:
        digest = write_manifest(gen_dir, world_size=world, info={"torch_version": torch.__version__})
        assert lineage is not None  # rank 0 always has one
        sign_generation(gen_dir, digest, lineage)  # before publishing: a reader never sees an unsigned LATEST
        publish(root, gen_dir.name, digest)

    writer = dcp.FileSystemWriter(str(gen_dir / DCP_DIR))
    if asynchronous:
        group = _async_group(pg) if pg is not None else None
        with _single_process_quiet(group):
            response = dcp.async_save(tensors, storage_writer=writer, process_group=group,
                                      no_dist=group is None)
        # a Future, or (newer torch) an AsyncSaveResponse whose upload_completion is the write's Future
        future = cast(Future, getattr(response, "upload_completion", response))
        handle = CheckpointHandle(gen_dir, future=future, pg=group, rank=rank, world=world, finalize=finalize)
        _IN_FLIGHT.append(handle)
        return handle
    error: BaseException | None = None
    try:
        with _single_process_quiet(pg):
            dcp.save(tensors, storage_writer=writer, process_group=pg, no_dist=pg is None)
        if rank == 0:
            finalize()
    except Exception as err:  # noqa: BLE001 - shared with every rank
        error = err
    _agree(error, pg, world, what=f"saving checkpoint {gen_dir}")
    return CheckpointHandle(gen_dir)


def save_checkpoint(path: str | Path, *, model: Any, optimizer: Any, scheduler: Any = None,
                    session_state: dict[str, Any], loader_state: Any = None,
                    typed_scheduler_state: Any = None, extra: Any = None, asynchronous: bool = False,
                    process_group: Any = None,
                    state_dicts: tuple[dict[str, Any], dict[str, Any]] | None = None) -> CheckpointHandle:
    """Save a new generation under ``path`` and publish it; collective over ``process_group``.

    Every rank of the group calls it. Returns a handle; a synchronous save is complete (and
    published) on return, an asynchronous one once ``handle.wait()`` returns on every rank.
    ``state_dicts`` (model, optimizer), already taken with ``get_state_dict``, replace
    ``model``/``optimizer``.
    """
    pg, rank, world = _group(process_group)
    _drain_in_flight()
    root = Path(path)
    error: BaseException | None = None
    tensors: dict[str, torch.Tensor] = {}
    docs: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    try:
        tensors, *encoded = _encode_state(model, optimizer, scheduler, session_state=session_state,
                                          loader_state=loader_state, typed_scheduler_state=typed_scheduler_state,
                                          extra=extra, rank=rank, world=world, state_dicts=state_dicts)
        docs = (encoded[0], encoded[1])
    except Exception as err:  # noqa: BLE001 - every rank must learn of it, or the others would hang
        error = err
    _agree(error, pg, world, what=f"encoding checkpoint state for {root}")
    gen_dir, lineage = _new_generation(root, docs[0], docs[1], pg, rank, world)
    return _write_tensors(tensors, root, gen_dir, lineage, asynchronous=asynchronous, pg=pg, rank=rank, world=world)


def save_session(path: str | Path, session: Any, *, loader_state: Any = None, typed_scheduler_state: Any = None,
                 extra: Any = None, asynchronous: bool = False) -> CheckpointHandle:
    """``save_checkpoint`` of a ``TorchDistributedSession``: its module, optimizer, scheduler and clocks.

    Refused while gradients are pending (they are not checkpointed): commit, or call
    ``finish_accumulation()`` / ``discard_accumulation()`` first.
    """
    if session.pending_accumulation:
        raise ValueError(
            f"cannot save mid-accumulation (pending_accumulation={session.pending_accumulation}): pending gradients "
            "are not checkpointed; save after a commit or call finish_accumulation()/discard_accumulation() first")
    return save_checkpoint(path, model=session.module, optimizer=session.optimizer, scheduler=session.scheduler,
                           session_state=to_dict(session.state())["data"], loader_state=loader_state,
                           typed_scheduler_state=typed_scheduler_state, extra=extra, asynchronous=asynchronous)


# ---- load -----------------------------------------------------------------------------------
def _read_documents(gen_dir: Path, digest: str | None, rank: int, world: int, allow_world_size_change: bool,
                    ) -> tuple[dict[str, Any], dict[str, Any], Any, int, dict[str, Any]]:
    """Check this rank's share of files and read the JSON documents from checked bytes; nothing is changed yet.

    Returns the documents and the manifest (every later read, DCP's included, is checked against it).
    """
    manifest = read_manifest(gen_dir, digest)
    problems = manifest_problems(gen_dir, manifest, shard=rank, shards=world, contents=False)
    if problems:
        file, problem = problems[0]
        more = f"; {len(problems) - 1} more file(s) fail too" if len(problems) > 1 else ""
        raise CorruptCheckpointError(file, problem + more)
    saved_world = manifest["world_size"]
    if saved_world != world and not allow_world_size_change:
        raise WorldSizeChangeError(
            f"checkpoint {gen_dir} was saved at world size {saved_world} and is being loaded at "
            f"world size {world}; pass allow_world_size_change=True to reshard the model and "
            "optimizer state through DCP and re-derive the rank-local state (RNG seeds, loader "
            "position) by the rule in docs/checkpoints.md")

    def document(path: Path, what: str) -> Any:
        rel = path.relative_to(gen_dir).as_posix()
        return parse_json(read_verified(gen_dir, manifest, rel), path, what=what)

    state = document(gen_dir / STATE_NAME, "global state")
    if saved_world == world:
        own = document(rank_file(gen_dir, rank), "rank-local state")
        return (state, _from_json(own["rng"], "rng"), _from_json(own["loader_state"], "loader_state"), saved_world,
                manifest)
    ranks = [document(rank_file(gen_dir, r), "rank-local state") for r in range(saved_world)]
    loaders = [_from_json(doc["loader_state"], f"rank {r} loader_state") for r, doc in enumerate(ranks)]
    return (state, {"rederive_from": ranks[0]["rng"]["torch_initial_seed"]},
            rederived_loader_state(loaders, new_world_size=world), saved_world, manifest)


def _locate(root: Path, *, trust: str, allow_rollback: bool, pg: Any, world: int, rank: int) -> tuple[Path, Any]:
    """Collective: rank 0 resolves ``LATEST`` and verifies its signature and rollback rule; every rank gets it."""
    error: BaseException | None = None
    located = ""
    if rank == 0:
        try:
            gen_dir, digest = locate_generation(root, trust=trust, allow_rollback=allow_rollback)
            located = json.dumps([str(gen_dir), digest])
        except Exception as err:  # noqa: BLE001 - every rank must learn of it
            error = err
    _agree(error, pg, world, what=f"locating the checkpoint at {root}")
    gen_text, digest = json.loads(_all_gather_text(located, pg, world)[0])
    return Path(gen_text), digest


def _read_verified(gen_dir: Path, digest: Any, *, scheduler: Any, allow_world_size_change: bool, pg: Any,
                   world: int, rank: int) -> tuple[dict[str, Any], dict[str, Any], Any, int, dict[str, Any]]:
    """Collective: every rank checks its share of the files and reads the documents (nothing changes yet)."""
    error: BaseException | None = None
    found: tuple[dict[str, Any], dict[str, Any], Any, int, dict[str, Any]] = ({}, {}, None, 0, {})
    try:
        found = _read_documents(gen_dir, digest, rank, world, allow_world_size_change)
        if scheduler is not None and found[0].get("scheduler") is None:
            raise CheckpointError(f"{gen_dir / STATE_NAME} holds no scheduler state but a scheduler was passed")
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # valid JSON of the wrong shape
        error = CorruptCheckpointError(gen_dir / STATE_NAME, f"unreadable state ({type(err).__name__}: {err})")
    except Exception as err:  # noqa: BLE001 - every rank must learn of it
        error = err
    _agree(error, pg, world, what=f"verifying checkpoint {gen_dir}")
    return found


def _template(model: Any, optimizer: Any, saved: dict[str, Any], gen_dir: Path, pg: Any,
              world: int) -> dict[str, torch.Tensor]:
    """Collective: this model's and optimizer's tensors for DCP to load into, checked against the saved ones."""
    fresh = not optimizer.state
    template: dict[str, torch.Tensor] = {}
    error: BaseException | None = None
    try:
        optimizer.zero_grad(set_to_none=True)  # lets get_state_dict create the optimizer state template
        msd, osd = get_state_dict(model, optimizer, options=_OPTIONS)
        template = {**_split(msd, "model")[1], **_split(osd, "optimizer")[1]}
        _check_keys(saved, template, gen_dir)
    except Exception as err:  # noqa: BLE001 - every rank must learn of it
        error = err
        if fresh:
            optimizer.state.clear()
    _agree(error, pg, world, what=f"matching checkpoint {gen_dir} to this model and optimizer")
    return {key: template[key] for key in saved}


def load_checkpoint(path: str | Path, *, model: Any, optimizer: Any, scheduler: Any = None,
                    allow_world_size_change: bool = False, process_group: Any = None, trust: str = "signed",
                    allow_rollback: bool = False) -> dict[str, Any]:
    """Verify, then restore the published generation under ``path``; collective over ``process_group``.

    First (rank 0, before any file is unpickled or any state changes) the manifest's signature must
    be by a trusted, unrevoked key (``trust="unsigned"`` skips that, logged) and ``LATEST`` must not
    point below a newer generation signed or seen here (``allow_rollback=True`` permits it; a
    ``gen-*`` folder passed directly is an explicit choice and is not a rollback).

    Returns ``session_state``, ``loader_state`` (this rank's), ``typed_scheduler_state``,
    ``extra``, ``saved_world_size``, ``world_size``, ``generation`` and ``rng`` ("restored" or
    "rederived"). Nothing is changed when verification or a check fails.
    """
    if trust not in CHECKPOINT_TRUST_MODES:
        raise ValueError(f"trust={trust!r}; expected one of {CHECKPOINT_TRUST_MODES}")
    pg, rank, world = _group(process_group)
    _drain_in_flight()
    gen_dir, digest = _locate(Path(path), trust=trust, allow_rollback=allow_rollback, pg=pg, world=world, rank=rank)
    state, rng, loader_state, saved_world, manifest = _read_verified(
        gen_dir, digest, scheduler=scheduler, allow_world_size_change=allow_world_size_change, pg=pg, world=world,
        rank=rank)
    fresh = not optimizer.state
    targets = _template(model, optimizer, state["tensors"], gen_dir, pg, world)
    _load_tensors(targets, gen_dir, manifest, pg, world, optimizer, fresh)
    set_state_dict(model, optimizer, model_state_dict=_from_json(state["model"], "model", targets),
                   optim_state_dict=_from_json(state["optimizer"], "optimizer", targets), options=_OPTIONS)
    if scheduler is not None:
        scheduler.load_state_dict(_from_json(state["scheduler"], "scheduler"))
    session_state = _from_json(state["session_state"], "session_state")
    if "rederive_from" in rng:
        step = session_state.get("step", 0) if isinstance(session_state, dict) else 0
        _reseed_rng(derive_seed("mixle-parallel/rng", rng["rederive_from"], step, rank, world))
    else:
        _restore_rng(rng)
    return {"session_state": session_state, "loader_state": loader_state,
            "typed_scheduler_state": _from_json(state["typed_scheduler_state"], "typed_scheduler_state"),
            "extra": _from_json(state["extra"], "extra"), "saved_world_size": saved_world,
            "world_size": world, "generation": gen_dir.name,
            "rng": "rederived" if "rederive_from" in rng else "restored"}


def _load_tensors(targets: dict[str, torch.Tensor], gen_dir: Path, manifest: dict[str, Any], pg: Any,
                  world: int, optimizer: Any, fresh: bool) -> None:
    """Collective: DCP loads ``targets`` through a reader that uses only bytes checked against ``manifest``.

    Every rank checks its files before any rank copies a tensor; on a refusal nothing was copied, and an
    optimizer state created for the template is dropped again.
    """
    def agree(err: BaseException | None) -> None:
        _agree(err, pg, world, what=f"checking the tensor files of checkpoint {gen_dir}")

    reader = VerifiedReader(gen_dir, manifest, DCP_DIR, agree)
    error: BaseException | None = None
    try:
        with _single_process_quiet(pg):
            dcp.load(targets, storage_reader=reader, process_group=pg, no_dist=pg is None)
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP wraps the reader's refusal (a BaseException)
        failures = getattr(err, "failures", {}).values()  # rank -> (exception, stack) in DCP's wrapping
        wrapped = [e for f in failures for e in (f if isinstance(f, tuple) else (f,)) if isinstance(e, CheckpointError)]
        error = reader.failure or (wrapped[0] if wrapped else err)
        if fresh:
            optimizer.state.clear()
    _agree(error, pg, world, what=f"loading the tensors of checkpoint {gen_dir}")


def load_session(path: str | Path, session: Any, *, allow_world_size_change: bool = False, trust: str = "signed",
                 allow_rollback: bool = False) -> dict[str, Any]:
    """``load_checkpoint`` into a ``TorchDistributedSession``: tensors, scheduler, RNG, then its clocks
    (``restore_state``); returns ``load_checkpoint``'s dict."""
    loaded = load_checkpoint(path, model=session.module, optimizer=session.optimizer, scheduler=session.scheduler,
                             allow_world_size_change=allow_world_size_change, trust=trust,
                             allow_rollback=allow_rollback)
    session.restore_state(from_dict(
        {"kind": "TorchSessionState", "version": SCHEMA_VERSION, "data": loaded["session_state"]},
        TorchSessionState))
    return loaded


def _check_keys(saved: dict[str, Any], template: dict[str, torch.Tensor], gen_dir: Path) -> None:
    """Every saved tensor has a counterpart of the same global shape; every model tensor is saved."""
    missing = sorted(k for k in saved if k not in template)
    unsaved = sorted(k for k in template if k.startswith("model") and k not in saved)
    if missing or unsaved:
        raise CheckpointError(
            f"checkpoint {gen_dir} does not match this model/optimizer: in the checkpoint only "
            f"{missing[:5]}, in the model only {unsaved[:5]}; load it into the same architecture "
            "(same module names) it was saved from")
    for key, record in saved.items():
        have = template[key]
        if list(have.shape) != record["shape"]:
            raise CheckpointError(
                f"checkpoint {gen_dir}: {key} has global shape {record['shape']} in the checkpoint "
                f"and {list(have.shape)} here; load it into the same architecture")
