"""Megatron checkpoints are signed generations, loaded only from bytes checked against the signed manifest
(issue 24 items 1-2). One world-1 gloo process runs every scenario (``_checkpoint_scenarios``)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")

from ._world import run_world  # noqa: E402


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    from . import _checkpoint_scenarios

    return run_world(1, _checkpoint_scenarios.checkpoint_body, str(tmp_path_factory.mktemp("megackpt")))[0]


def test_a_save_is_a_signed_generation_that_loads_back_exactly(outcomes):
    files = outcomes["files"]
    assert {"MANIFEST.json", "MANIFEST.sig", "_SUCCESS", "dcp/.metadata", "dcp/common.pt",
            "dcp/metadata.json"} <= set(files)
    assert any(f.endswith(".distcp") for f in files)
    assert outcomes["roundtrip"] == {"error": None, "step": 2, "equal": True}


def test_a_metadata_swapped_after_its_check_is_refused_and_never_unpickled(outcomes):
    swap = outcomes["metadata_swap"]
    assert swap["error"] is not None and ".metadata" in swap["error"], swap
    assert swap["unchanged"]
    assert not outcomes["marker"]


def test_a_shard_swapped_for_another_runs_is_refused_before_any_tensor_changes(outcomes):
    swap = outcomes["shard_swap"]
    assert swap["error"] is not None and ".distcp" in swap["error"] and "sha256" in swap["error"], swap
    assert swap["unchanged"]


def test_common_pt_is_loaded_from_its_checked_bytes_only(outcomes):
    late = outcomes["common_swap_late"]  # swapped after its check: megatron never reads the file again
    assert late["error"] is None and late["equal"], late
    early = outcomes["common_swap_early"]  # swapped before its check: refused
    assert early["error"] is not None and "common.pt" in early["error"], early
    assert early["unchanged"]
    assert not outcomes["marker"]


def test_an_unsigned_generation_is_refused_unless_trust_unsigned(outcomes):
    assert "unsigned" in outcomes["unsigned"]["error"] and outcomes["unsigned"]["unchanged"]
    assert outcomes["unsigned_opt_out"]["error"] is None and outcomes["unsigned_opt_out"]["equal"]


def test_another_runs_generation_copied_over_ours_is_refused_unless_on_purpose(outcomes):
    foreign = outcomes["foreign"]
    assert foreign["error"] is not None and "UntrustedCheckpointError" in foreign["error"], foreign
    assert "belongs to run" in foreign["error"], foreign
    assert foreign["unchanged"]
    assert outcomes["foreign_on_purpose"]["error"] is None and outcomes["foreign_on_purpose"]["equal"]


def test_a_plain_megatron_folder_and_a_rolled_back_latest_are_refused(outcomes):
    plain = outcomes["plain"]
    assert plain["error"] is not None and "no checkpoint at" in plain["error"] and plain["unchanged"], plain
    rollback = outcomes["rollback"]
    assert rollback["error"] is not None and "rolled back" in rollback["error"] and rollback["unchanged"], rollback
