"""Resources constructors, persistence, and discovery against real engines (dask, MPI, Spark, torchrun env)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mixle_parallel.contracts import ContractError, DeviceSpec, Resources
from mixle_parallel.contracts.resources import local_cpu_count


def test_single_cpu_and_local() -> None:
    one = Resources.single_cpu(memory_bytes=1024, throughput=2.0, precision="fp64")
    assert len(one) == 1 and one.devices[0].throughput == 2.0 and one.devices[0].memory_bytes == 1024
    local = Resources.local(3, memory_bytes=3000)
    assert [d.name for d in local] == ["cpu:0", "cpu:1", "cpu:2"]
    assert all(d.memory_bytes == 1000 for d in local)  # slots share the host's memory


def test_discover_counts_every_local_cpu() -> None:
    found = Resources.discover(include_torch=False)
    assert len([d for d in found if d.kind == "cpu"]) == local_cpu_count() == len(os.sched_getaffinity(0))
    assert len(Resources.discover(include_torch=False, cpu_workers=1)) == 1


def test_discover_with_torch_adds_only_real_accelerators() -> None:
    torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")
    found = Resources.discover(include_torch=True)
    cuda = [d for d in found if d.kind == "cuda"]
    assert len(cuda) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_fastest_prefers_throughput_then_order() -> None:
    res = Resources.from_specs([DeviceSpec("a", throughput=1.0), DeviceSpec("b", throughput=3.0),
                                DeviceSpec("c", throughput=3.0)])
    assert res.fastest().name == "b"
    assert res.total_throughput == 7.0


def test_persistence_round_trips(tmp_path: Path) -> None:
    res = Resources.local(2, memory_bytes=4096, precision="bf16")
    assert Resources.from_dict(res.to_dict()) == res
    assert Resources.from_json(res.to_json(indent=2)) == res
    path = res.save(tmp_path / "res.json", indent=2)
    assert Resources.load(path) == res
    doc = json.loads(path.read_text())
    doc["data"]["devices"][0]["throughput"] = -1.0
    with pytest.raises(ContractError, match="throughput"):
        Resources.from_dict(doc)


def test_from_mpi_environment_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    assert len(Resources.from_mpi()) == 1
    monkeypatch.setenv("PMI_SIZE", "3")
    assert [d.name for d in Resources.from_mpi()] == ["mpi:0", "mpi:1", "mpi:2"]


def test_from_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # outside torchrun: this process's one local slot, as mixle 0.8.2 gives
    (slot,) = Resources.from_torchrun(memory_bytes=2**30).devices
    assert (slot.kind, slot.index, slot.host, slot.memory_bytes) == ("cpu", 0, "node0", 2**30)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(RuntimeError, match="torchrun"):
        Resources.from_torchrun()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    res = Resources.from_torchrun()
    assert [d.host for d in res] == ["node0", "node0", "node1", "node1"]
    assert [d.index for d in res] == [0, 1, 0, 1]
    assert {d.engine for d in res} == {"torch"} and slot.engine == "torch"  # mixle's engine for torch ranks


def test_device_kind_gpu_engine_and_document_as_mixle_reads_them() -> None:
    gpu = DeviceSpec("g0", kind="gpu", memory_bytes=8_000_000_000, throughput=4.0)
    assert gpu.is_gpu and gpu.engine == "numpy" and not DeviceSpec("c").is_gpu
    assert DeviceSpec.from_dict(gpu.to_dict()) == gpu and gpu.to_dict()["data"]["kind"] == "gpu"
    assert Resources.local(2).devices[0].engine == "numpy"
    with pytest.raises(ValueError, match="DeviceSpec.kind='tensor-core' is not known"):
        DeviceSpec("x", kind="tensor-core")


def test_torchrun_job_is_described_by_torchrun(tmp_path: Path) -> None:
    """A real ``torchrun --standalone --nproc-per-node 2`` job: every rank sees the same two slots."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun comes with the optional [torch] extra")
    script = tmp_path / "slots.py"
    out = tmp_path / "out"
    out.mkdir()
    script.write_text(
        "import os, sys\nfrom mixle_parallel import Resources\n"
        f"open(os.path.join({str(out)!r}, os.environ['RANK']), 'w').write(Resources.from_torchrun().to_json())\n"
    )
    subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(script)], check=True,
                   capture_output=True, timeout=180)
    docs = [Resources.from_json((out / r).read_text()) for r in ("0", "1")]
    assert docs[0] == docs[1] and len(docs[0]) == 2


@pytest.mark.mpi
def test_from_mpi_under_mpiexec(tmp_path: Path) -> None:
    mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).with_name("mpiexec"))
    pytest.importorskip("mpi4py", reason="mpi4py comes with the optional [mpi] extra")
    script = tmp_path / "mpi_slots.py"
    # Each rank writes its own file: ranks' stdout lines can interleave under mpiexec.
    script.write_text(
        "from mpi4py import MPI\nimport json, sys\nfrom mixle_parallel import Resources\n"
        "comm = MPI.COMM_WORLD\n"
        "a, b = Resources.from_mpi(comm), Resources.from_mpi()\n"
        "open(f'{sys.argv[1]}/rank{comm.Get_rank()}.json', 'w').write("
        "json.dumps([comm.Get_rank(), len(a), len(b), a == b]))\n"
    )
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    rows = sorted(json.loads(p.read_text()) for p in tmp_path.glob("rank*.json"))
    assert rows == [[0, 2, 2, True], [1, 2, 2, True]]


@pytest.mark.slow
def test_from_dask_local_cluster() -> None:
    distributed = pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  memory_limit="1GiB") as cluster, distributed.Client(cluster) as client:
        res = Resources.from_dask(client)
    assert len(res) == 2
    assert all(d.memory_bytes == 2**30 for d in res)
    assert all(d.name.startswith("dask:tcp://") for d in res)


@pytest.mark.slow
def test_from_spark_local_context(spark_context: Any) -> None:
    """The session's ``local[2,4]`` context (a process holds one SparkContext; its own would clash with the
    fixture's in any order where a Spark test ran first): two threads, two slots."""
    res = Resources.from_spark(spark_context)
    assert [d.name for d in res] == ["spark:0", "spark:1"]
