"""megatron certified in situ (issue 23 item 1): a launched 2-rank gloo world with an empty trust store.

Before: ``prepare`` refused with NotAdmittedError naming `mixle-parallel certify`. Now the first ``prepare``
runs the harness's MLP workload through megatron on these very ranks, rank 0 signs, both ranks train
``certified``; the second ``prepare`` reuses the stored certificate. The certificate records in situ, world
size 2, cpu/gloo, and that the probe of the user's module was skipped, with the reason; every receipt of both runs
says so too (``module_probe``, issue 34 item 5), and rank 0 logs it first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is the optional [megatron] extra")

from mixle_parallel.executors.megatron.backend import MEGATRON_PROBE_SKIPPED  # noqa: E402
from mixle_parallel.verification.attestation import load_certificate, open_envelope  # noqa: E402
from mixle_parallel.verification.keys import TrustStore  # noqa: E402

from ._in_situ_body import in_situ_body  # noqa: E402
from ._world import run_world  # noqa: E402

pytestmark = pytest.mark.slow


def test_megatron_certifies_in_situ_and_reuses_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    ranks = run_world(2, in_situ_body, str(home))
    [path] = sorted((home / "certificates").glob("*.json"))
    certificate, _ = open_envelope(load_certificate(path), TrustStore(home))
    for result in ranks:
        assert [r["admission"] for r in result["runs"]] == ["certified", "certified"]
        assert {r["certificate"] for r in result["runs"]} == {certificate.certificate_id}
    measurement = certificate.measurement
    assert certificate.executor == "megatron" and measurement is not None and measurement.site == "in_situ"
    assert (measurement.world_size, measurement.workload) == (2, "mlp")
    assert (certificate.device_kind, certificate.comm_backend) == ("cpu", "gloo")
    assert (measurement.probe, measurement.probe_reason) == ("skipped", MEGATRON_PROBE_SKIPPED)
    for result in ranks:  # the probe that could not run is named in every receipt, of the reused certificate too
        assert [r["module_probe"] for r in result["runs"]] == [f"skipped: {MEGATRON_PROBE_SKIPPED}"] * 2
    probe_lines = [line for line in ranks[0]["logged"] if "module probe" in line]
    assert probe_lines == [f"mixle-parallel: module probe skipped: {MEGATRON_PROBE_SKIPPED}"] * 2
    assert not [line for line in ranks[1]["logged"] if "module probe" in line]  # rank 0 logs it, once per run
