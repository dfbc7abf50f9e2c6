"""Resilient EM on mp: retries, a blacklist, and mid-fit checkpoints a killed driver resumes on the same bits.

``ResilientMPEncodedData`` runs its chunks on a ``ResilientMPChunkRunner`` (a dead worker is
restarted in its place until it has failed ``max_retries`` times, then blacklisted). With
``checkpoint=PATH`` each E-step is computed a batch of combine groups at a time and folded on the
driver in the canonical order; after every batch the running fold (rows, log-likelihood, the
statistics' canonical bytes) is written to PATH as JSON, atomically, together with the
statistics of every finished pass. Nothing written to disk is a pickle. :meth:`ResilientMPEncodedData.fit` started
again with the same data, estimator and start model after the driver was killed rebuilds the
model of the interrupted pass from the previous pass's statistics (``estimate`` is deterministic),
reloads the running fold and computes only the groups that were missing: the fit ends on the bits
of an uninterrupted one.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import pickle  # nosec B403 - mixle's fold payloads (the caller's own, in memory); nothing on disk is a pickle
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from ....contracts.bounded_json import CHECKPOINT_STATE_LIMITS, parse_object, read_limited
from ....contracts.estimation import canonical_statistic_bytes, statistic_digest
from ..backends.resilient_mp import ResilientMPChunkRunner
from ..em_pass.chunks import GroupFold, chunk_estep
from ..em_pass.combine_order import GroupStats, combine_groups, fold_group
from ..em_pass.finite_guard import decode_payload, finish_accumulator
from ..em_pass.statistic_codec import statistic_from_bytes
from ..handle import ChunkedEncodedData

__all__ = ["CHECKPOINT_KIND", "ResilientMPEncodedData", "checkpointed_fold"]

CHECKPOINT_KIND = "mixle-parallel/em-checkpoint/v1"
_T = TypeVar("_T")


def _pack(stats: Any) -> str:
    return base64.b64encode(canonical_statistic_bytes(stats)).decode("ascii")


def _unpack(text: str) -> Any:
    return statistic_from_bytes(base64.b64decode(text))


def checkpointed_fold(estimator: Any, payloads: Sequence[Any],
                      checkpoint_after: int | None = None) -> tuple[float, Any]:
    """Fold payloads in order into one accumulator and return ``(nobs, value)`` after mixle's
    ``key_merge``/``key_replace``; with ``checkpoint_after=k`` the running fold is serialized after payload
    ``k``, the accumulator dropped and rebuilt from the bytes (``from_value``): the result has the same bits.

    Payloads are mixle 0.8.2's pickled ``(count, value)`` bytes (the caller's own, in memory) or
    ``(count, stats)`` / ``(count, log_likelihood, stats)`` tuples. The checkpoint is the canonical statistic
    bytes (``pickle`` in memory only for a statistic those cannot carry, such as a mixle dict of labels)."""
    acc = estimator.accumulator_factory().make()
    nobs = 0.0
    for i, raw in enumerate(payloads):
        entry = decode_payload(raw, i)
        nobs += entry[0]
        acc.combine(entry[-1])
        if checkpoint_after is not None and i == checkpoint_after:
            nobs, restored = _round_trip(float(nobs), acc.value())
            del acc  # as after a crash: only the serialized state survives
            acc = estimator.accumulator_factory().make()
            acc.from_value(restored)
    return float(nobs), finish_accumulator(acc)


def _round_trip(nobs: float, value: Any) -> tuple[float, Any]:
    """``(nobs, value)`` written to bytes and read back: canonical statistic bytes, else an in-memory pickle."""
    try:
        raw = canonical_statistic_bytes(value)
    except (TypeError, ValueError):
        blob = pickle.dumps((nobs, value), protocol=pickle.HIGHEST_PROTOCOL)
        back: tuple[float, Any] = pickle.loads(blob)  # nosec B301 - the bytes made on the line above
        return back
    return float.fromhex(nobs.hex()), statistic_from_bytes(raw)


def _canonical_shard_payloads(groups: Sequence[tuple[int, bytes]], expected_shards: set[int]) -> list[bytes]:
    """mixle 0.8.2's private helper, kept for code that imports it: ``(shard id, payload)`` pairs in shard order,
    refusing a bad, unknown, duplicate or missing shard and a non-bytes payload (``RuntimeError``)."""
    by_shard: dict[int, bytes] = {}
    for shard, payload in groups:
        if isinstance(shard, bool) or not isinstance(shard, (int, np.integer)):
            raise RuntimeError(f"worker returned invalid shard identity {shard!r}")
        if int(shard) not in expected_shards:
            raise RuntimeError(f"worker returned unknown shard {int(shard)}")
        if int(shard) in by_shard:
            raise RuntimeError(f"worker returned duplicate payload for shard {int(shard)}")
        if not isinstance(payload, bytes):
            raise RuntimeError(f"worker returned a non-bytes payload for shard {int(shard)}")
        by_shard[int(shard)] = payload
    missing = sorted(set(expected_shards) - set(by_shard))
    if missing:
        raise RuntimeError(f"no payload for shard(s) {missing}")
    return [by_shard[k] for k in sorted(by_shard)]


class ResilientMPEncodedData(ChunkedEncodedData):
    """The mp handle with retries, a blacklist and (``checkpoint=``) resumable mid-fit checkpoints."""

    runner: ResilientMPChunkRunner

    def __init__(self, data: Sequence[Any], estimator: Any = None, encoder: Any = None,
                 num_workers: int | None = None, sub_chunks: int = 1, max_retries: int = 2,
                 worker_timeout_s: float = 30.0, *, num_chunks: int | None = None, checkpoint: str | None = None,
                 groups_per_batch: int | None = None) -> None:
        if isinstance(sub_chunks, bool) or not isinstance(sub_chunks, int) or sub_chunks < 1:
            raise ValueError(f"sub_chunks must be an int >= 1, got {sub_chunks!r}")
        runner = ResilientMPChunkRunner(num_workers, max_retries=max_retries, timeout=worker_timeout_s)
        try:
            super().__init__(runner, data, estimator=estimator, encoder=encoder,
                             num_chunks=num_chunks if num_chunks is not None else runner.num_workers * sub_chunks)
        except BaseException:
            runner.close()
            raise
        self.checkpoint_path = None if checkpoint is None else os.fspath(checkpoint)
        self.groups_per_batch = groups_per_batch
        self.resumed_from: tuple[int, int] | None = None
        """(iteration, groups already folded) of the checkpoint this handle resumed, if any."""
        self.last_round_reused_shards: set[int] = set()
        """Chunks of the last E-step that came back from the worker first sent them (mixle's shards are chunks)."""
        self.last_round_recomputed_shards: set[int] = set()
        """Chunks of the last E-step recomputed after their worker died."""
        self.last_round_failed_workers: set[int] = set()
        """Workers that failed during the last E-step (restarted, or blacklisted)."""
        self.last_round_blacklisted_workers: set[int] = set()
        """Workers blacklisted during the last E-step."""

    # -- mixle 0.8.2's private views (its tests and some callers read them) ----------------------------
    @property
    def _blacklist(self) -> set[int]:
        return self.blacklist

    @property
    def _conns(self) -> dict[int, None]:
        """The live, not blacklisted workers (keys only: the pipes are the runner's)."""
        runner = self.runner
        return {w: None for w in runner.live_workers if w not in runner.blacklist}

    @property
    def _failures(self) -> dict[int, int]:
        runner = self.runner
        return {w: int(runner.failures.get(w, 0)) for w in range(runner.num_workers)}

    @property
    def _worker_shards(self) -> dict[int, set[int]]:
        """Chunks (mixle's shards) each live worker is sent in a plain pass."""
        runner = self.runner
        out: dict[int, set[int]] = {}
        if self._scattered:
            for chunk, worker in enumerate(runner.chunk_owners()):
                out.setdefault(int(worker), set()).add(chunk)
        return out

    # -- rounds and the fault hook (mixle 0.8.2's names) ----------------------------------------------
    def arm_kill(self, hook: Callable[[int, Any], None] | None) -> None:
        """Arm a one-shot fault hook for the next E-step: ``hook(worker_id, process)`` is called for every live
        worker after it acknowledges the E-step and before it is sent any chunk work (a kill there always lands
        before the worker accumulates). The E-step after it ends on the bits of a clean one. None disarms."""
        self.runner.arm_kill(hook)

    def _in_round(self, run: Callable[[], _T]) -> _T:
        """``run()`` as one round: the runner's round sets (and an armed kill hook) start fresh, then are copied."""
        runner = self.runner
        runner.begin_round()
        try:
            return run()
        finally:
            self.last_round_reused_shards = set(runner.round_reused)
            self.last_round_recomputed_shards = set(runner.round_recomputed)
            self.last_round_failed_workers = set(runner.round_failed)
            self.last_round_blacklisted_workers = set(runner.round_blacklisted)

    def estep(self, estimator: Any, model: Any) -> Any:
        """One data pass (``ChunkedEncodedData.estep``) as one round: see the ``last_round_*`` sets."""
        return self._in_round(lambda: super(ResilientMPEncodedData, self).estep(estimator, model))

    def pysp_stream_accumulate(self, estimator: Any, model: Any) -> tuple[float, Any]:
        """mixle's streaming fold, as one round."""
        return self._in_round(lambda: super(ResilientMPEncodedData, self).pysp_stream_accumulate(estimator, model))

    @property
    def blacklist(self) -> set[int]:
        """Workers blacklisted after ``max_retries`` failures."""
        return set(self.runner.blacklist)

    # -- checkpoints ----------------------------------------------------------------------------
    def _identity(self, estimator: Any) -> dict[str, Any]:
        return {"rows": self.num_rows, "chunks": self.num_chunks, "estimator": type(estimator).__qualname__}

    def _load(self, estimator: Any) -> dict[str, Any] | None:
        if self.checkpoint_path is None or not os.path.exists(self.checkpoint_path):
            return None
        what = f"EM checkpoint {self.checkpoint_path}"  # a regular file, within its limit, strict JSON (safe_read)
        doc = parse_object(read_limited(self.checkpoint_path, CHECKPOINT_STATE_LIMITS, what=what),
                           CHECKPOINT_STATE_LIMITS, what=what)
        if doc.get("kind") != CHECKPOINT_KIND:
            raise ValueError(f"{self.checkpoint_path} is not an EM checkpoint (kind {doc.get('kind')!r})")
        if doc["identity"] != self._identity(estimator):
            raise ValueError(f"checkpoint {self.checkpoint_path} is of another fit ({doc['identity']}, this one "
                             f"{self._identity(estimator)}); remove it or pass another checkpoint=")
        return dict(doc)

    def _save(self, doc: dict[str, Any]) -> None:
        if self.checkpoint_path is None:
            return
        tmp = f"{self.checkpoint_path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.checkpoint_path)

    # -- a checkpointed pass --------------------------------------------------------------------
    def _batches(self) -> list[list[tuple[int, int]]]:
        groups = list(combine_groups(self.num_chunks))
        size = self.groups_per_batch or max(1, len(self.runner.live_workers))
        return [groups[i:i + size] for i in range(0, len(groups), size)]

    def _checkpointed_pass(self, estimator: Any, model: Any, doc: dict[str, Any]) -> GroupStats:
        """The pass of ``doc['iteration']``, batch by batch, resuming its running fold; same bits as fold_pass."""
        self._ensure_scattered(estimator, model)
        batches = self._batches()
        running = doc.get("running")
        done = int(running["groups"]) if running else 0
        acc, count, ll = None, 0.0, 0.0
        if running:
            acc = estimator.accumulator_factory().make()
            acc.from_value(_unpack(running["stats"]))
            count, ll = float.fromhex(running["count"]), float.fromhex(running["log_likelihood"])
        n_groups = len(combine_groups(self.num_chunks))
        seen = 0
        for batch in batches:
            if seen + len(batch) <= done:
                seen += len(batch)
                continue
            ids = [c for a, b in batch for c in range(a, b)]
            fold = GroupFold(chunk_estep, self.num_chunks)
            entries = self._metered.map_chunks(fold, (estimator, model), ids)  # type: ignore[arg-type]  # NamedTuple __call__
            by_chunk = dict(zip(ids, entries))
            for a, b in batch:
                group = [by_chunk[c] for c in range(a, b)]
                part = group[-1] if isinstance(group[-1], GroupStats) else fold_group(estimator, group)
                if n_groups == 1:
                    return GroupStats(float(part[0]), float(part[1]), part[2])
                if acc is None:
                    acc = estimator.accumulator_factory().make()
                count += float(part[0])
                ll += float(part[1])
                acc.combine(part[2])
            seen += len(batch)
            assert acc is not None
            doc["running"] = {"groups": seen, "count": count.hex(), "log_likelihood": ll.hex(),
                              "stats": _pack(acc.value())}
            self._save(doc)
        assert acc is not None
        return GroupStats(count, ll, acc.value())

    def fit(self, estimator: Any, model: Any, max_its: int = 10) -> Any:
        """``max_its`` E/M passes from ``model``, checkpointed; resumes a checkpoint of the same fit."""
        doc = self._load(estimator) or {"kind": CHECKPOINT_KIND, "identity": self._identity(estimator),
                                        "iteration": 0, "passes": []}
        if doc["passes"] or doc.get("running"):
            self.resumed_from = (int(doc["iteration"]), int((doc.get("running") or {}).get("groups", 0)))
        if doc["passes"]:  # the model of the interrupted pass, from the previous pass's statistics
            last = doc["passes"][-1]
            model = estimator.estimate(float.fromhex(last["count"]), _unpack(last["stats"]))
        while int(doc["iteration"]) < max_its:
            total = self._in_round(functools.partial(self._checkpointed_pass, estimator, model, doc))
            model = estimator.estimate(total.count, total.stats)
            doc["passes"].append({"count": total.count.hex(), "log_likelihood": total.log_likelihood.hex(),
                                  "stats": _pack(total.stats), "digest": statistic_digest(total.stats)})
            doc["iteration"] = int(doc["iteration"]) + 1
            doc["running"] = None
            self._save(doc)
            self.iteration = int(doc["iteration"])
        return model
