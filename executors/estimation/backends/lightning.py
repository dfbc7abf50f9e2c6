"""The ``lightning`` backend: mini-batch (stochastic) EM whose batches come from a Lightning ``DataModule``.

Full-data EM runs on a local chunk runner, so ``pysp_seq_*`` give the bits of ``backend="local"``
with the same chunking (``batch_size`` rows per chunk unless chunking is given). The Lightning part
is the mini-batch iteration: :attr:`LightningEncodedData.datamodule` is a real
``lightning.pytorch.LightningDataModule`` whose ``train_dataloader()`` is a torch ``DataLoader``
(``num_workers`` loader processes) over the handle's mini-batch plan -- the chunk ids of each batch,
drawn from ``(seed, epoch, batch_size, num_rows)`` only. ``minibatches(epoch=)`` yields the raw rows
of each batch (mixle's shape); ``stochastic_em()`` runs the shared stepwise core on the same batches.
Lightning and torch are imported when a handle is built, never when this module is.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..api import encoded_data
from ..compat.reference_handles import BuiltByEncodedData
from ..em_pass.chunks import count_rows
from ..fitting.minibatch import minibatch_spec
from ..handle import ChunkedEncodedData, handle_from_runner
from ..options import EncodedDataOptions
from .local import LocalChunkRunner

__all__ = ["LightningEncodedData", "lightning_encoded_data"]


class _ChunkIds:
    """Map-style dataset of chunk ids (picklable for loader worker processes): item ``i`` is ``i``."""

    def __init__(self, num_chunks: int) -> None:
        self.num_chunks = num_chunks

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, index: int) -> int:
        return int(index)


class _PlannedBatches:
    """A ``DataLoader`` batch sampler replaying one epoch of a mini-batch plan."""

    def __init__(self, plan: Sequence[Sequence[int]]) -> None:
        self.plan = [list(b) for b in plan]

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(b) for b in self.plan])

    def __len__(self) -> int:
        return len(self.plan)


def _collate_chunk_ids(batch: Sequence[Any]) -> list[int]:
    """A loader batch as plain chunk ids, ascending (a batch's chunks are folded in chunk order)."""
    return sorted(int(c) for c in batch)


@functools.cache
def _datamodule_class() -> type:
    """``EncodedDataModule``, a ``LightningDataModule`` subclass (defined once Lightning is imported)."""
    try:
        import lightning.pytorch as pl
        from torch.utils.data import DataLoader
    except ImportError as exc:
        raise ImportError(f"backend='lightning' needs Lightning and torch ({exc}); install the extra: "
                          "pip install 'mixle-parallel[lightning]'") from None

    class EncodedDataModule(pl.LightningDataModule):
        """A DataModule whose train DataLoader yields one epoch of a handle's mini-batches (chunk ids)."""

        def __init__(self, handle: LightningEncodedData, num_workers: int) -> None:
            super().__init__()
            self._plan_of, self._chunks, self._workers = handle.minibatch_plan, handle.num_chunks, num_workers
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            """The epoch the next ``train_dataloader()`` serves."""
            self.epoch = int(epoch)

        def train_dataloader(self) -> Any:
            """A DataLoader over the plan of the current epoch (then the next epoch is current)."""
            epoch, self.epoch = self.epoch, self.epoch + 1
            dataset: Any = _ChunkIds(self._chunks)  # a map-style dataset by protocol (torch stays unimported here)
            return DataLoader(dataset, batch_sampler=_PlannedBatches(self._plan_of(epoch=epoch)),
                              num_workers=self._workers, collate_fn=_collate_chunk_ids)

    return EncodedDataModule


def _loader_workers(num_workers: Any) -> int:
    """``num_workers`` of the DataLoader (mixle's meaning): an int >= 0, None for 0."""
    if num_workers is None:
        return 0
    if isinstance(num_workers, bool):
        raise TypeError("lightning backend num_workers (DataLoader worker processes) must be an int >= 0, got a bool")
    try:
        n = operator.index(num_workers)
    except TypeError:
        raise TypeError(f"lightning backend num_workers (DataLoader worker processes) must be an int >= 0, got "
                        f"{type(num_workers).__name__} {num_workers!r}") from None
    if n < 0:
        raise ValueError(f"lightning backend num_workers (DataLoader worker processes) must be >= 0, got {n}")
    return int(n)


class LightningEncodedData(BuiltByEncodedData, ChunkedEncodedData):
    """mixle's ``LightningEncodedData(data, estimator, model, encoder, batch_size, shuffle, seed, num_workers,
    sub_chunks)``: ``encoded_data(..., backend="lightning")``; mini-batches through a Lightning DataModule."""

    @classmethod
    def _build(cls, data: Any, estimator: Any = None, model: Any = None, encoder: Any = None,
               batch_size: int | None = None, shuffle: bool = True, seed: int = 0, num_workers: int = 0,
               sub_chunks: int = 1, **options: Any) -> Any:
        return encoded_data(data, estimator=estimator, model=model, encoder=encoder, batch_size=batch_size,
                            shuffle=shuffle, seed=seed, num_workers=num_workers, sub_chunks=sub_chunks,
                            backend="lightning", **options)

    def _bind_loader(self, rows: Any, num_workers: int) -> None:
        self._rows = rows
        self.loader_workers = num_workers
        """DataLoader worker processes (they carry chunk ids; the statistics are computed here)."""
        self._datamodule = _datamodule_class()(self, num_workers)

    @property
    def backend(self) -> str:
        """``lightning``."""
        return "lightning"

    @property
    def size(self) -> int:
        """Rows of the data (mixle's name)."""
        return self.num_rows

    @property
    def batch_size(self) -> int:
        """Rows per mini-batch asked for (batches are runs of whole chunks of about this many rows)."""
        return int(self.minibatch.batch_size or 1)

    @property
    def shuffle(self) -> bool:
        """Whether the batch order is shuffled each epoch."""
        return self.minibatch.shuffle

    @property
    def seed(self) -> int:
        """The seed of the batch order."""
        return self.minibatch.seed

    @property
    def datamodule(self) -> Any:
        """The ``lightning.pytorch.LightningDataModule`` serving the mini-batches (chunk ids per batch)."""
        return self._datamodule

    def _epoch_batches(self, epoch: int) -> Iterable[Sequence[int]]:
        """Stochastic EM's batches of ``epoch``, drawn through the DataModule's DataLoader."""
        self._datamodule.set_epoch(epoch)
        return iter(self._datamodule.train_dataloader())

    def minibatches(self, *, epoch: int | None = None) -> Iterator[list[Any]]:
        """The raw rows of each mini-batch of one epoch (``epoch``; None: the DataModule's next epoch)."""
        if epoch is not None:
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(f"epoch must be an int >= 0 or None, got {epoch!r}")
            self._datamodule.set_epoch(epoch)
        loader = self._datamodule.train_dataloader()
        rows, bounds = self._rows, self.bounds

        def batches() -> Iterator[list[Any]]:
            for ids in loader:
                yield [row for c in ids for row in rows[bounds[c][0]:bounds[c][1]]]

        return batches()

    def __len__(self) -> int:
        return self.num_rows


def lightning_encoded_data(data: Any, *, batch_size: int | None = None, shuffle: bool | None = None,
                           seed: int | None = None, num_workers: int | None = None,
                           **params: Any) -> LightningEncodedData:
    """Factory of the ``lightning`` backend: ``batch_size`` defaults to a tenth of the rows (mixle's) and sets
    the chunking when none is given (a mini-batch is one chunk); ``num_workers`` are the DataLoader's."""
    workers = _loader_workers(num_workers)
    _datamodule_class()  # Lightning missing: say so before encoding anything
    spec = minibatch_spec(count_rows(data), batch_size, shuffle, seed)
    handle = handle_from_runner(LocalChunkRunner(1), data, handle_class=LightningEncodedData,
                                batch_size=spec.batch_size, shuffle=spec.shuffle, seed=spec.seed, **params)
    assert isinstance(handle, LightningEncodedData)
    handle._bind_loader(data, workers)
    return handle


ENCODED_DATA_OPTIONS = frozenset({"batch_size", "shuffle", "seed", "num_workers"})
"""The ``encoded_data`` options the lightning backend honours besides the handle's own."""

WORKER_PROCESSES = False
"""The statistics are computed in this process (DataLoader workers only carry chunk ids): a world of one."""


def planned_workers(options: EncodedDataOptions) -> int:
    """DataLoader workers the handle will use (at least one: the process computing the statistics)."""
    return max(1, _loader_workers(options.num_workers))
