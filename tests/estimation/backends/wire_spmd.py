"""One rank's part of the SPMD pass-byte checks (torchrun under a gloo world, mpi under mpiexec): a probe
pass whose exact bytes the rank also computes itself, and two EM iterations' receipts."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from mixle_parallel.executors.estimation.backends.chunk_assignment import block_assignment
from tests.estimation.backends import chunk_probes as probes
from tests.estimation.backends import wire_case


def _dumps(value: Any) -> int:
    return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def probe_pass(runner: Any) -> dict[str, Any]:
    """A ``wide`` pass over 6 chunks: what the runner counted and the sizes this rank computes for the
    payload pickle and for the pickle of every rank's own results."""
    chunks = probes.make_chunks(6)
    runner.scatter(chunks)
    before = (runner.wire.sent, runner.wire.received)
    out = runner.map_chunks(probes.wide, probes.WIRE_PAYLOAD)
    ok = [float(o[0]) for o in out] == [float(np.sum(c[1])) * 2.0 for c in chunks]
    blocks = block_assignment(6, runner.size)
    own = [{i: probes.wide(chunks[i], probes.WIRE_PAYLOAD) for i in ids} for ids in blocks]
    # the root's ordered list holds its own arrays and the peers' as they arrive (unpickled: their dtype
    # objects are not the root's, so the list's pickle memoizes less)
    arrived = {**own[0], **{i: v for d in own[1:] for i, v in pickle.loads(pickle.dumps(d)).items()}}
    return {"rank": runner.rank, "ok": ok, "sent": runner.wire.sent - before[0],
            "received": runner.wire.received - before[1], "payload": _dumps(probes.WIRE_PAYLOAD),
            "own_dicts": [_dumps(d) for d in own], "own_lists": [_dumps((list(d.items()), None)) for d in own],
            "ordered": _dumps(("ok", [arrived[i] for i in range(len(chunks))]))}


def em_receipts(backend: str, **options: Any) -> dict[str, Any]:
    """Two E-steps on this rank's handle: each receipt's bytes and the runner's count."""
    from mixle_parallel.executors.estimation import encoded_data

    data = np.random.default_rng(0).normal(size=400)
    est, model = wire_case.mixture()
    handle = encoded_data(data, estimator=est, backend=backend, num_chunks=4, admission="unverified", audit=False,
                          **options)
    try:
        bytes_ = []
        for _ in range(2):
            model = handle.estep(est, model).model
            bytes_.append((handle.last_receipt.collective_bytes, handle.last_receipt.extra["bytes_observed"]))
        total = int(handle.runner.transport_bytes)
    finally:
        handle.close()
    return {"receipts": bytes_, "runner_total": total, "model_pickle": _dumps((est, model))}


def torchrun_body(rank: int, world: int) -> dict[str, Any]:
    """Inside a gloo world started by the harness's spawner (RANK/WORLD_SIZE set as torchrun would)."""
    from mixle_parallel.executors.estimation.backends.torchrun import TorchRunRunner

    return {"probe": probe_pass(TorchRunRunner()), "em": em_receipts("torchrun")}
