"""Receipts against the wire: each step's StepReceipts must report the collectives the flight recorder saw.

A trial that exposes ``receipts()`` (the ``StepReceipt``s its session issued during the last step) has
them compared, per rank and step, with the step's traced collectives: counts per kind exactly (on gloo a
receipt's ``reduce_scatter`` is recorded as ``all_reduce``, see ``collectives.GLOO_REALIZATIONS``) and
``collective_bytes`` within ``BYTES_RTOL`` of the recorded bytes (``collectives.entry_bytes``, the same
definition as the session's meter). Integer-only broadcasts may or may not be in a receipt: DDP's
bucket-order sync (its reducer, in C++) is invisible to a session, an integer buffer's broadcast is
not; so a receipt may count any number of them up to what was recorded, and their bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ...contracts import CollectiveKind, DistributedUpdate
from .collectives import (
    GLOO_REALIZATIONS,
    collective_kind,
    is_metadata,
    realized_kinds,
)

BYTES_RTOL = 0.05
"""Receipt bytes may differ from the recorded bytes by this fraction (padding, coalescing metadata)."""


def receipt_summary(receipts: Sequence[Any]) -> dict[str, Any]:
    """Total bytes and counts per kind of the receipts one step issued (what the worker ships back)."""
    counts: Counter[str] = Counter()
    nbytes = 0
    for receipt in receipts:
        nbytes += int(receipt.collective_bytes)
        for kind, n in dict(receipt.extra.get("collectives", {}) or {}).items():
            counts[str(kind)] += int(n)
    return {"bytes": nbytes, "counts": dict(counts), "receipts": len(receipts)}


def _observed(collectives: Sequence[Any]) -> tuple[int, Counter[str], int, int]:
    """(bytes, counts) of the data entries, then (count, bytes) of the integer-only broadcasts."""
    nbytes, counts, meta_n, meta_bytes = 0, Counter[str](), 0, 0
    for entry in collectives:
        kind = collective_kind(entry[0])
        if kind is None:
            continue
        size = int(entry[3]) if len(entry) > 3 else 0
        if is_metadata(entry):
            meta_n, meta_bytes = meta_n + 1, meta_bytes + size
            continue
        counts[kind.value] += 1
        nbytes += size
    return nbytes, counts, meta_n, meta_bytes


def _as_recorded(counts: Mapping[str, int], backend: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for kind, n in counts.items():
        known = CollectiveKind(kind) if kind in {k.value for k in CollectiveKind} else None
        if backend == "gloo" and known in GLOO_REALIZATIONS:
            kind = GLOO_REALIZATIONS[known].value
        if n:
            out[kind] += n
    return out


def judge_receipts(updates: Sequence[DistributedUpdate], by_rank: list[list[dict[str, Any]]], *,
                   backend: str = "gloo") -> tuple[dict[str, list[str]], tuple[str, ...]]:
    """Per update the receipt mismatches that concern it, and one measured line per compared step."""
    talking = [u for u in updates if u.collective is not CollectiveKind.NONE]
    failures: dict[str, list[str]] = {}
    measured: list[str] = []
    for rank, runs in enumerate(by_rank):
        for run in runs:
            if run["repeat"]:
                continue
            for index, step in enumerate(run["steps"]):
                got, traced = step.get("receipts"), step.get("collectives")
                if got is None or traced is None:
                    continue
                seen_bytes, seen, meta_n, meta_bytes = _observed(traced)
                claimed = _as_recorded(got["counts"], backend)
                extra = min(max(claimed["broadcast"] - seen["broadcast"], 0), meta_n)  # integer broadcasts counted
                if extra:
                    seen["broadcast"] += extra
                    seen_bytes += meta_bytes
                where = f"step {index} on rank {rank} (seed {run['seed']}, {got['receipts']} receipts)"
                measured.append(f"{where}: receipts {got['bytes']} B {dict(sorted(claimed.items()))}, "
                                f"observed {seen_bytes} B {dict(sorted(seen.items()))}")
                off = abs(got["bytes"] - seen_bytes) > BYTES_RTOL * seen_bytes
                if off:
                    text = (f"{where}: receipts report {got['bytes']} bytes, the flight recorder saw {seen_bytes} "
                            f"(more than {BYTES_RTOL:.0%} apart)")
                    for update in talking:
                        failures.setdefault(update.node_id, []).append(text)
                for kind in sorted(set(claimed) | set(seen)):
                    if claimed[kind] == seen[kind]:
                        continue
                    text = f"{where}: receipts count {kind} x{claimed[kind]}, the flight recorder saw x{seen[kind]}"
                    owners = [u for u in talking if kind in {k.value for k in realized_kinds(u.collective, backend)}]
                    for update in owners or talking:
                        failures.setdefault(update.node_id, []).append(text)
    return failures, tuple(measured)
