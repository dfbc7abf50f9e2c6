"""mixle's fault-tolerant-training loader and snapshot names over our checkpoints.

``LoaderState`` is one rank's position in a deterministic stream (``seed, epoch, rank,
world_size, batch_idx``); ``resume_batches`` resumes a loader with mixle's ``epoch_batches(epoch)``
contract exactly there; ``synthetic_batch_for_state`` is a batch that is a pure function of it.
``save_checkpoint_async`` stages model, optimizer and loader position now and writes a verified,
published generation in the background (``executors.torch.checkpoint``); a torchdata
``StatefulDataLoader`` is saved through its own ``state_dict()``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from ...contracts._checks import non_negative_int, positive_int
from .checkpoint import CheckpointHandle, save_checkpoint
from .checkpoint import load_checkpoint as _load
from .dcp_checkpoint import load_training_metadata

_LOADER_KIND = "mixle_parallel.LoaderState"


@attrs.frozen
class LoaderState:
    """One rank's resumable loader position: the batch ``batch_idx`` of epoch ``epoch`` of its stream."""

    seed: int = attrs.field(validator=non_negative_int)
    epoch: int = attrs.field(validator=non_negative_int)
    rank: int = attrs.field(validator=non_negative_int)
    world_size: int = attrs.field(validator=positive_int)
    batch_idx: int = attrs.field(default=0, validator=non_negative_int)

    def __attrs_post_init__(self) -> None:
        if self.rank >= self.world_size:
            raise ValueError(f"LoaderState.rank={self.rank} must be < world_size={self.world_size}")

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready dict."""
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoaderState:
        """Inverse of ``to_dict`` (unknown keys are refused)."""
        unknown = set(d) - {"seed", "epoch", "rank", "world_size", "batch_idx", "kind"}
        if unknown:
            raise ValueError(f"unknown LoaderState keys {sorted(unknown)}")
        return cls(d["seed"], d["epoch"], d["rank"], d["world_size"], d.get("batch_idx", 0))

    def advanced(self, n: int = 1) -> LoaderState:
        """The position after ``n`` more batches of this epoch."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        return attrs.evolve(self, batch_idx=self.batch_idx + n)


def resume_batches(corpus: Any, state: LoaderState) -> Iterator[Any]:
    """``corpus.epoch_batches(state.epoch)`` with the first ``state.batch_idx`` batches skipped (the stream is
    a pure function of seed, epoch, rank and world size, so the rest is what an uninterrupted run reads)."""
    if not callable(getattr(corpus, "epoch_batches", None)):
        raise TypeError(f"{type(corpus).__name__} has no epoch_batches(epoch); resume_batches needs mixle's "
                        "StreamingCorpus contract (a deterministic iterator per epoch)")
    it = iter(corpus.epoch_batches(state.epoch))
    for i in range(state.batch_idx):
        try:
            next(it)
        except StopIteration:
            raise ValueError(f"epoch {state.epoch} holds {i} batches, fewer than batch_idx={state.batch_idx}") \
                from None
    return it


def synthetic_batch_for_state(state: LoaderState, *, vocab: int, block: int, batch_size: int,
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens (batch, block), next token (batch,))`` drawn from a seed folded from the whole state:
    equal states give the same bits, different positions never share a draw."""
    for name, v in (("vocab", vocab), ("block", block), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    s = state
    seed = np.random.SeedSequence([s.seed, s.epoch, s.rank, s.world_size, s.batch_idx]).generate_state(1)[0]
    rng = np.random.default_rng(int(seed))
    x = rng.integers(0, vocab, size=(batch_size, block))
    y = rng.integers(0, vocab, size=(batch_size,))
    return torch.as_tensor(x, dtype=torch.long), torch.as_tensor(y, dtype=torch.long)


@attrs.define
class AsyncCheckpointHandle:
    """A snapshot being written: ``prepare_time_s`` is what the caller was blocked for (staging)."""

    handle: CheckpointHandle
    path: str
    prepare_time_s: float

    def wait(self, timeout: float | None = None) -> None:
        """Block until the generation is written and published (collective); raises if the write failed."""
        if timeout is not None:
            deadline = time.monotonic() + timeout
            while not self.handle.done():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the checkpoint write to {self.path} did not finish within {timeout} s")
                time.sleep(0.01)
        self.handle.wait()

    @property
    def done(self) -> bool:
        """True once written and published."""
        return self.handle.done()


def _loader_doc(loader_state: Any) -> Any:
    if isinstance(loader_state, LoaderState):
        return {"kind": _LOADER_KIND, **loader_state.to_dict()}
    state_dict = getattr(loader_state, "state_dict", None)
    if callable(state_dict):  # torchdata's StatefulDataLoader (or any stateful loader)
        return {"kind": "state_dict", "state": state_dict()}
    return loader_state


def save_checkpoint_async(module: Any, optimizer: Any, path: str, loader_state: Any, *,
                          extra: dict[str, Any] | None = None) -> AsyncCheckpointHandle:
    """Stage ``(module, optimizer, loader position)`` now and write it in the background (collective).

    ``loader_state``: a LoaderState, a stateful loader (its ``state_dict()``, e.g. torchdata's
    StatefulDataLoader), or JSON-ready data; the step recorded is the LoaderState's ``batch_idx``.
    """
    start = time.perf_counter()
    step = loader_state.batch_idx if isinstance(loader_state, LoaderState) else 0
    handle = save_checkpoint(path, model=module, optimizer=optimizer, session_state={"step": step},
                             loader_state=_loader_doc(loader_state), extra={"user": dict(extra or {})},
                             asynchronous=True)
    return AsyncCheckpointHandle(handle, str(Path(path)), time.perf_counter() - start)


def load_checkpoint(module: Any, optimizer: Any, path: str, *, loader: Any = None, trust: str = "signed",
                    allow_rollback: bool = False) -> Any:
    """Verify and restore ``path`` into ``module``/``optimizer``; returns the saved loader position (a
    LoaderState, or the stateful loader's state, also loaded into ``loader`` when given). ``trust`` and
    ``allow_rollback`` are ``checkpoint.load_checkpoint``'s opt-outs."""
    doc = _load(path, model=module, optimizer=optimizer, trust=trust, allow_rollback=allow_rollback)["loader_state"]
    if isinstance(doc, dict) and doc.get("kind") == _LOADER_KIND:
        return LoaderState.from_dict(doc)
    if isinstance(doc, dict) and doc.get("kind") == "state_dict":
        if loader is not None:
            loader.load_state_dict(doc["state"])
        return doc["state"]
    return doc


def load_checkpoint_extra(path: str, *, trust: str = "signed", allow_rollback: bool = False) -> dict[str, Any]:
    """The verified ``extra`` a snapshot was saved with, without touching any model (``load_training_metadata``:
    signature, lineage and high-water mark checked; ``trust="unsigned"`` / ``allow_rollback=True`` opt out)."""
    extra = load_training_metadata(path, trust=trust, allow_rollback=allow_rollback)["extra"]
    return dict(extra or {})
