"""DeviceSpec and Resources: placement targets, discovered without importing any engine."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from ._checks import (
    non_empty_str,
    optional_non_negative_int,
    optional_str,
    positive_finite,
    to_float,
)
from .serialization import from_dict, from_json, register_contract, to_dict, to_json

DEVICE_KINDS = frozenset({"cpu", "cuda", "gpu", "mps", "xpu", "tpu", "rocm"})
"""``gpu`` is mixle 0.8.2's generic accelerator kind (no vendor named)."""
GPU_KINDS = frozenset({"cuda", "gpu", "mps", "rocm", "xpu"})


def _kind(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if value not in DEVICE_KINDS:
        raise ValueError(f"DeviceSpec.kind={value!r} is not known; allowed: {sorted(DEVICE_KINDS)}")


@register_contract
@attrs.frozen
class DeviceSpec:
    """One placement target: a CPU worker slot, a GPU, a remote executor slot."""

    name: str = attrs.field(validator=non_empty_str)
    kind: str = attrs.field(default="cpu", validator=_kind)
    index: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    memory_bytes: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    throughput: float = attrs.field(default=1.0, converter=to_float, validator=positive_finite)
    precision: str | None = attrs.field(default=None, validator=optional_str)
    host: str | None = attrs.field(default=None, validator=optional_str)
    engine: str = attrs.field(default="numpy", kw_only=True, validator=non_empty_str)
    """The compute engine that runs on it (mixle's field): ``numpy`` for CPU slots, ``torch`` for torch ranks."""

    @property
    def is_gpu(self) -> bool:
        """Whether the device is an accelerator (CUDA, ROCm, MPS, XPU or mixle's generic ``gpu``)."""
        return self.kind in GPU_KINDS

    def to_dict(self) -> dict[str, Any]:
        """A versioned JSON-ready document (the one converter)."""
        return to_dict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> DeviceSpec:
        """Inverse of ``to_dict``."""
        return from_dict(payload, cls)


def _devices(values: Iterable[DeviceSpec]) -> tuple[DeviceSpec, ...]:
    out = tuple(values)
    for d in out:
        if not isinstance(d, DeviceSpec):
            raise TypeError(f"Resources.devices must hold DeviceSpec, got {type(d).__name__}")
    return out


def _unique_names(inst: object, attribute: attrs.Attribute, value: tuple[DeviceSpec, ...]) -> None:
    if not value:
        raise ValueError("Resources needs at least one device; use Resources.single_cpu() for one CPU")
    names = [d.name for d in value]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"Resources device names must be unique; repeated: {dupes}")


def local_cpu_count() -> int:
    """CPUs this process may run on (affinity-aware), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def physical_memory_bytes() -> int | None:
    """Total physical memory of this host, or None when the platform does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover
        return None


def _split(memory_bytes: int | None, parts: int) -> int | None:
    return None if memory_bytes is None else memory_bytes // parts


@register_contract
@attrs.frozen
class Resources:
    """A collection of placement targets with advisory throughput and memory."""

    devices: tuple[DeviceSpec, ...] = attrs.field(converter=_devices, validator=_unique_names)

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[DeviceSpec]:
        return iter(self.devices)

    @property
    def total_throughput(self) -> float:
        """Sum of the devices' throughput weights."""
        return float(sum(d.throughput for d in self.devices))

    # ---- constructors ------------------------------------------------------------------
    @classmethod
    def single_cpu(
        cls, memory_bytes: int | None = None, throughput: float = 1.0, precision: str | None = None
    ) -> Resources:
        """One CPU device."""
        return cls((DeviceSpec("cpu:0", "cpu", 0, memory_bytes, throughput, precision, socket.gethostname()),))

    @classmethod
    def local(
        cls, num_cpus: int | None = None, memory_bytes: int | None = None, precision: str | None = None
    ) -> Resources:
        """Local CPU resources split into ``num_cpus`` worker slots sharing this host's memory."""
        n = local_cpu_count() if num_cpus is None else num_cpus
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"Resources.local(num_cpus={num_cpus!r}) needs an int >= 1")
        total = physical_memory_bytes() if memory_bytes is None else memory_bytes
        host = socket.gethostname()
        return cls(
            tuple(DeviceSpec(f"cpu:{i}", "cpu", i, _split(total, n), 1.0, precision, host) for i in range(n))
        )

    @classmethod
    def discover(
        cls, include_torch: bool = True, cpu_workers: int | None = None, precision: str | None = None
    ) -> Resources:
        """Every local CPU, plus CUDA devices when ``include_torch`` and torch is installed."""
        devices = list(cls.local(cpu_workers, precision=precision).devices)
        if include_torch and "torch" not in sys.modules:
            import importlib.util

            if importlib.util.find_spec("torch") is None:
                include_torch = False
        if include_torch:
            import torch  # an explicit request: discovery through torch

            if torch.cuda.is_available():
                host = socket.gethostname()
                for i in range(torch.cuda.device_count()):
                    props = torch.cuda.get_device_properties(i)
                    # Advisory weight: streaming multiprocessors relative to a CPU slot.
                    devices.append(
                        DeviceSpec(f"cuda:{i}", "cuda", i, int(props.total_memory),
                                   float(max(1, props.multi_processor_count)), precision, host, engine="torch")
                    )
        return cls(tuple(devices))

    @classmethod
    def from_specs(cls, specs: Iterable[DeviceSpec]) -> Resources:
        """Build resources from device specifications."""
        return cls(tuple(specs))

    @classmethod
    def from_mpi(
        cls,
        comm: Any = None,
        memory_bytes: int | None = None,
        throughput: float = 1.0,
        precision: str | None = None,
    ) -> Resources:
        """One CPU slot per MPI rank, from ``comm.Get_size()`` or the launcher's environment."""
        if comm is not None:
            size = int(comm.Get_size())
        else:
            size = 1
            for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_WORLD_SIZE", "SLURM_NTASKS"):
                if os.environ.get(var, "").isdigit():
                    size = int(os.environ[var])
                    break
        return cls(
            tuple(DeviceSpec(f"mpi:{r}", "cpu", r, memory_bytes, throughput, precision) for r in range(size))
        )

    @classmethod
    def from_dask(cls, client: Any, precision: str | None = None) -> Resources:
        """One slot per worker thread of a dask.distributed-like client (``scheduler_info()``)."""
        try:
            info = client.scheduler_info(n_workers=-1)
        except TypeError:
            info = client.scheduler_info()
        workers = info.get("workers", {})
        if not workers:
            raise ValueError("the dask client reports no workers; start the cluster's workers first")
        devices = []
        for address, worker in sorted(workers.items()):
            threads = int(worker.get("nthreads", 1) or 1)
            memory = worker.get("memory_limit")
            host = worker.get("host") or address
            for t in range(threads):
                devices.append(
                    DeviceSpec(f"dask:{address}/{t}", "cpu", t, _split(int(memory), threads) if memory else None,
                               1.0, precision, str(host))
                )
        return cls(tuple(devices))

    @classmethod
    def from_spark(
        cls, spark_context: Any, memory_bytes: int | None = None, precision: str | None = None
    ) -> Resources:
        """One CPU slot per unit of the SparkContext's default parallelism."""
        n = int(spark_context.defaultParallelism)
        return cls(tuple(DeviceSpec(f"spark:{i}", "cpu", i, memory_bytes, 1.0, precision) for i in range(n)))

    @classmethod
    def from_torchrun(cls, memory_bytes: int | None = None, precision: str | None = None) -> Resources:
        """One slot per global rank of a torchrun/torchelastic job, from its environment; outside torchrun
        (no ``WORLD_SIZE``) the one local slot of this process, as mixle 0.8.2 gives."""
        if "WORLD_SIZE" not in os.environ:
            return cls((DeviceSpec("rank:0", "cpu", 0, memory_bytes, 1.0, precision, "node0", engine="torch"),))
        try:
            world = int(os.environ["WORLD_SIZE"])
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        except (KeyError, ValueError):
            raise RuntimeError(
                "Resources.from_torchrun needs the torchrun environment (WORLD_SIZE, RANK, LOCAL_RANK); "
                "start the script with `torchrun --nproc-per-node N script.py`"
            ) from None
        if world < 1 or local_world < 1:
            raise RuntimeError(
                f"torchrun environment is inconsistent: WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local_world}"
            )
        return cls(
            tuple(
                DeviceSpec(f"rank:{r}", "cpu", r % local_world, memory_bytes, 1.0, precision, f"node{r // local_world}",
                           engine="torch")
                for r in range(world)
            )
        )

    def fastest(self) -> DeviceSpec:
        """The device with the largest advisory throughput (the first on ties)."""
        return max(self.devices, key=lambda d: d.throughput)

    # ---- persistence through the one converter -------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A versioned JSON-ready document."""
        return to_dict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Resources:
        """Inverse of ``to_dict``."""
        return from_dict(payload, cls)

    def to_json(self, **kwargs: Any) -> str:
        """Serialize, calibrated throughput included; ``kwargs`` go to ``json.dumps``."""
        return to_json(self, **kwargs)

    @classmethod
    def from_json(cls, text: str) -> Resources:
        """Inverse of ``to_json``."""
        return from_json(text, cls)

    def save(self, path: str | os.PathLike[str], **kwargs: Any) -> Path:
        """Write the JSON document to ``path`` (atomically) and return the path."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(self.to_json(**kwargs), encoding="utf-8")
        os.replace(tmp, target)
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Resources:
        """Read resources saved with ``save``."""
        return cls.from_json(Path(path).read_text(encoding="utf-8"))
