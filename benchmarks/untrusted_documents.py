"""Time and peak memory to refuse untrusted documents of 3 MB holding 10^6 bad items (issue 24 item 5).

    python benchmarks/untrusted_documents.py [--items 1500000] [--repeats 3] [--planted 400] [--only TEXT]

One row per document kind, each refused through the reader production uses: a contract document
(``from_json``), a certificate file (``load_certificate``), an envelope whose payload is over the limit
(``open_envelope``), a ledger seal (``check_seal``), a ledger head file (``read_head``), a checkpoint
manifest signature (``verify_generation``), and a contract document under every limit whose first item
is bad (the converter must stop there). Columns: document size, best wall time of ``--repeats`` runs,
peak traced Python allocation (tracemalloc, a separate run) and the first words of the refusal.
The issue's figures before this change: 23-45 s and ~2 GB per document.

The last row (issue 34 item 2, needs torch) is a load that must succeed: ``load_checkpoint`` of a root
whose one signed generation sits below ``--planted`` planted ``gen-*`` folders, each holding a 1 MiB
``MANIFEST.sig`` (hard links to one file); its size column is the planted bytes, its last column what was
loaded. Budget: <= 1 s (27 s before the newer-generation scan was bounded). ``--only TEXT`` keeps the rows
whose name holds TEXT.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mixle_parallel.contracts import (
    IN_TOTO_PAYLOAD_TYPE,
    CertificateEnvelope,
    EnvelopeSignature,
    Resources,
    from_json,
)
from mixle_parallel.verification.attestation import load_certificate, open_envelope
from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.ledger.seal import check_seal, read_head


def _envelope_document(items: int) -> dict[str, Any]:
    data = {"payload_type": IN_TOTO_PAYLOAD_TYPE, "payload": "e30=", "signatures": [1] * items}
    return {"kind": "CertificateEnvelope", "version": 1, "data": data}


def _write(path: Path, document: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, separators=(",", ":")))
    return path


def _refusal(call: Callable[[], Any]) -> str:
    try:
        outcome = call()
    except Exception as exc:  # noqa: BLE001 - the refusal is what is measured
        return str(exc)
    if isinstance(outcome, str):  # check_seal returns its problem
        return outcome
    raise SystemExit(f"a document was accepted: {outcome!r}")


def _measure(call: Callable[[], Any], repeats: int) -> tuple[float, int, str]:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        text = _refusal(call)
        best = min(best, time.perf_counter() - started)
    tracemalloc.start()
    try:
        _refusal(call)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return best, peak, text


def _cases(folder: Path, items: int) -> list[tuple[str, int, Callable[[], Any]]]:
    from mixle_parallel.executors.torch.checkpoint_trust import verify_generation

    store = TrustStore(folder / "home")
    store.init()
    compact = (",", ":")
    contract = json.dumps({"kind": "Resources", "version": 1, "data": {"devices": [1] * items}}, separators=compact)
    first_bad = json.dumps({"kind": "Resources", "version": 1, "data": {"devices": [1] * (items // 4)}},
                           separators=compact)
    cert = _write(folder / "cert.json", _envelope_document(items))
    head = _write(folder / "run.jsonl.head", _envelope_document(items))
    generation = folder / "ckpt" / "gen-00000001"
    _write(generation / "MANIFEST.sig", _envelope_document(items))
    (generation / "MANIFEST.json").write_text("{}")
    payload = CertificateEnvelope(IN_TOTO_PAYLOAD_TYPE, "QUFB" * (items * 2 // 3),
                                  (EnvelopeSignature("ab" * 32, "AAAA"),))
    seal = _envelope_document(items)
    return [
        ("contract document (from_json)", len(contract), lambda: from_json(contract, Resources)),
        ("contract, first item bad", len(first_bad), lambda: from_json(first_bad, Resources)),
        ("certificate file", cert.stat().st_size, lambda: load_certificate(cert)),
        ("envelope payload", len(payload.payload), lambda: open_envelope(payload, store)),
        ("ledger seal", len(json.dumps(seal, separators=compact)),
         lambda: check_seal(seal, 3, "sha256:" + "0" * 64, store)),
        ("ledger head file", head.stat().st_size, lambda: read_head(head, store)),
        ("manifest signature", (generation / "MANIFEST.sig").stat().st_size,
         lambda: verify_generation(generation, trust_store=store)),
    ]


def _planted_generations(folder: Path, count: int, items: int) -> tuple[str, int, Callable[[], Any]]:
    """A signed checkpoint under ``count`` planted ``gen-*`` folders with 1 MiB signatures: the load's cost."""
    import torch

    from mixle_parallel.executors.torch.checkpoint import load_checkpoint, save_checkpoint

    root = folder / "planted"
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(root, model=model, optimizer=optimizer, session_state={"step": 1})
    signature = _write(folder / "planted.sig", _envelope_document(min(items, ((1 << 20) - 200) // 2)))
    for number in range(2, 2 + count):
        (root / f"gen-{number:08d}").mkdir()
        os.link(signature, root / f"gen-{number:08d}" / "MANIFEST.sig")

    def load() -> str:
        generation = load_checkpoint(root, model=model, optimizer=optimizer)["generation"]
        return f"loaded {generation} past {count} planted gen-* folders"

    return (f"checkpoint, {count} planted gen-*", count * signature.stat().st_size, load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_500_000, help="bad items per document (1.5e6: ~3 MB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--planted", type=int, default=400, help="planted gen-* folders of the last row")
    parser.add_argument("--only", default="", help="keep only the rows whose name holds this text")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MIXLE_PARALLEL_HOME"] = str(Path(tmp) / "home")
        cases = _cases(Path(tmp), args.items)
        if args.only in f"checkpoint, {args.planted} planted gen-*":  # the only row that needs torch
            cases.append(_planted_generations(Path(tmp), args.planted, args.items))
        rows = [(name, size, *_measure(call, args.repeats)) for name, size, call in cases if args.only in name]
    print(f"{'document':<32} {'bytes':>11} {'seconds':>8} {'peak MiB':>9}  refusal")
    for name, size, seconds, peak, text in rows:
        print(f"{name:<32} {size:>11,} {seconds:>8.3f} {peak / 2**20:>9.1f}  {text[:90]}")


if __name__ == "__main__":
    main()
