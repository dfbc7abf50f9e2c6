"""``save_checkpoint(..., provenance=True)``: the generation gets a signed statement beside it (one process)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is the optional [torch] extra")


def _session(ledger=None):
    import torch

    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors import get_training_backend
    from tests.torch._models import SEQ, VOCAB, TinyLM

    torch.manual_seed(0)
    session = get_training_backend("torch_native").prepare(
        TinyLM(), plan=ParallelPlan(), optimizer="SGD", lr=0.1, **({"ledger": ledger} if ledger else {}))
    tokens = torch.randint(0, VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(0))
    session.train_batch(tokens[:, :-1], tokens[:, 1:])
    return session


def test_a_final_save_writes_the_generation_provenance(tmp_path):
    from mixle_parallel.executors.torch.checkpoint_trust import generation_lineage
    from mixle_parallel.verification.provenance import open_provenance, subject_problems

    session = _session(tmp_path / "ledger.jsonl")
    handle = session.save_checkpoint(str(tmp_path / "ckpt"), provenance=True, data="TinyLM tokens, seed 0")
    session.close()
    statement_file = tmp_path / "ckpt" / f"{handle.path.name}.intoto.json"
    statement, _ = open_provenance(statement_file)
    names = {s["name"] for s in statement["subject"]}
    assert {"gen-00000001/MANIFEST.json", "gen-00000001/MANIFEST.sig", "gen-00000001/state.json"} <= names
    assert subject_problems(statement_file, statement) == []
    external = statement["predicate"]["buildDefinition"]["externalParameters"]
    assert external["run_id"] == generation_lineage(handle.path)[1].run_id
    assert external["artefact"]["kind"] == "checkpoint-generation"
    assert external["data"] == {"kind": "described", "description": "TinyLM tokens, seed 0"}


def test_provenance_is_refused_without_a_ledger_or_on_an_asynchronous_save(tmp_path):
    session = _session()
    with pytest.raises(ValueError, match="synchronous save"):
        session.save_checkpoint(str(tmp_path / "a"), provenance=True, asynchronous=True)
    with pytest.raises(ValueError, match="pass provenance=True"):
        session.save_checkpoint(str(tmp_path / "a"), data="x")
    with pytest.raises(ValueError, match="binds the run's ledger"):
        session.save_checkpoint(str(tmp_path / "b"), provenance=True)
    session.close()


def test_verify_run_checks_generations_and_refuses_a_tampered_one(tmp_path):
    from mixle_parallel.run_verification import verify_run

    session = _session(tmp_path / "ledger.jsonl")
    session.save_checkpoint(str(tmp_path / "ckpt"))
    session.save_checkpoint(str(tmp_path / "ckpt"), provenance=True, data="TinyLM tokens, seed 0")
    session.close()
    verdict = verify_run(tmp_path)
    by_target = {(c.check, c.target): c for c in verdict.checks}
    assert by_target[("checkpoint", "ckpt/gen-00000001")].ok and by_target[("checkpoint", "ckpt/gen-00000002")].ok
    assert by_target[("checkpoint", "ckpt/LATEST")].ok and by_target[("provenance", "ckpt/gen-00000002.intoto.json")].ok
    assert by_target[("files", ".")].ok and by_target[("ledger", "ledger.jsonl")].ok
    # one process on CPU runs without a certificate: the statement says so, and verify-run does not pass it
    assert "unverified" in by_target[("agreement", "ckpt/gen-00000002.intoto.json")].detail and not verdict.ok
    shard = next((tmp_path / "ckpt" / "gen-00000002" / "dcp").glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped
    failed = {(c.check, c.target): c.detail for c in verify_run(tmp_path).failures}
    assert "sha256 differs" in failed[("checkpoint", "ckpt/gen-00000002")]
    assert shard.name in failed[("provenance", "ckpt/gen-00000002.intoto.json")]


def test_verify_run_refuses_a_generation_of_another_run_swapped_in(tmp_path):
    import shutil

    from mixle_parallel.run_verification import verify_run

    run = tmp_path / "run"
    session = _session(run / "ledger.jsonl")
    session.save_checkpoint(str(run / "ckpt"))
    session.save_checkpoint(str(run / "ckpt"), provenance=True)
    session.close()
    other = _session()
    other.save_checkpoint(str(tmp_path / "other"))  # a validly signed gen-00000001 of another run
    other.close()
    shutil.rmtree(run / "ckpt" / "gen-00000001")
    shutil.copytree(tmp_path / "other" / "gen-00000001", run / "ckpt" / "gen-00000001")
    failed = {(c.check, c.target): c.detail for c in verify_run(run).failures}
    assert "does not follow gen-00000001" in failed[("checkpoint", "ckpt/gen-00000002")]
    assert ("checkpoint", "ckpt/gen-00000001") not in failed  # on its own it is a valid generation
