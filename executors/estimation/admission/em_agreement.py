"""The collective over which the ranks of a launched EM run agree on admission (issue 34 item 6).

An SPMD EM handle (backend ``mpi`` under ``mpiexec``, ``torchrun`` under torchrun) is built on every rank, and
each rank's gate decides from its own trust store. Before any EM collective the ranks exchange their admission
views over the handle's own communicator (``comm.allgather`` for MPI, ``all_gather_object`` on the handle's
process group for torchrun) and compare them with ``verification.rank_agreement``, the comparison training
uses: one decision every rank follows, or the same ``NotAdmittedError`` on every rank naming each rank's view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ....verification.capability import active_harness_capability
from ....verification.rank_agreement import AdmissionView, ViewExchange
from ...training_in_situ import launcher_name
from ..backends.deadline import DEFAULT_TIMEOUT_S
from ..backends.optional_engine import require_engine
from ..backends.torchrun_group import init_default_group, torchrun_variables
from ..options import EncodedDataOptions
from .executor_identity import em_identity_name

__all__ = ["rank_exchange"]


class _CommExchange:
    """The views over an MPI communicator: one ``allgather``."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def __call__(self, view: AdmissionView) -> Sequence[AdmissionView]:
        """Every rank's view, in rank order."""
        return list(self.comm.allgather(dict(view)))


class _GroupExchange:
    """The views over a ``torch.distributed`` process group (None: the default one): one ``all_gather_object``."""

    def __init__(self, dist: Any, group: Any) -> None:
        self.dist, self.group = dist, group

    def __call__(self, view: AdmissionView) -> Sequence[AdmissionView]:
        """Every rank's view, in rank order."""
        views: list[Any] = [None] * int(self.dist.get_world_size(group=self.group))
        self.dist.all_gather_object(views, dict(view), group=self.group)
        return views


def _mpi_exchange(options: EncodedDataOptions, world_size: int) -> ViewExchange | None:
    """The handle's communicator (``comm=``, else ``COMM_WORLD`` inside an mpiexec job) when it is the world the
    gate admits; None outside a job (MPI is not started just to agree with no one)."""
    comm = options.comm
    if comm is None:
        if launcher_name() != "mpiexec":
            return None
        comm = require_engine("mpi4py.MPI", "mpi").COMM_WORLD
    return _CommExchange(comm) if int(comm.Get_size()) == world_size else None


def _torchrun_exchange(options: EncodedDataOptions, world_size: int) -> ViewExchange | None:
    """The handle's process group (``group=``/``comm=``, else the default one, made from torchrun's variables as
    the runner would make it, with the handle's ``timeout=`` and ``backend_name=``) when it is the world the gate
    admits; None where the runner would make none (no torchrun variables, ``init_process_group=False``)."""
    dist = require_engine("torch.distributed", "torch")
    group = options.extra.get("group", options.comm)
    if not dist.is_initialized():
        if group is not None or not options.extra.get("init_process_group", True) or not torchrun_variables():
            return None  # the runner refuses, or runs one process: nothing to agree with
        init_default_group(options.extra.get("backend_name"), options.extra.get("timeout", DEFAULT_TIMEOUT_S))
    return _GroupExchange(dist, group) if int(dist.get_world_size(group=group)) == world_size else None


def rank_exchange(name: str, world_size: int, options: EncodedDataOptions | None) -> ViewExchange | None:
    """The collective the ranks of a launched SPMD EM run of backend ``name`` over ``world_size`` ranks agree over
    (None: nothing to agree over: another backend, one rank, no launched job, or the harness's own trials,
    which every rank runs alike under the in-situ capability)."""
    kind = em_identity_name(name)
    if kind not in ("mpi", "torchrun") or world_size <= 1 or active_harness_capability() is not None:
        return None
    given = options if options is not None else EncodedDataOptions()
    return _mpi_exchange(given, world_size) if kind == "mpi" else _torchrun_exchange(given, world_size)
