"""The admission gate of ``encoded_data``: on a real device mesh, run only under an accepted certificate.

The executor identity is ``identity.EMExecutorIdentity(backend)`` (capabilities
``em_<backend>``, data parallelism over workers, fp64), the plan ``ParallelPlan(dp_replicate=
workers)`` and the precision ``"fp64"`` -- exactly what ``mixle-parallel certify --backend mp
--plan dp_replicate=2 --workload gaussian_mixture`` measures, so that certificate admits ``mp`` with
any number of workers (the certificate binds the plan's axis family, not its size).

What counts as a real mesh is ``verification.require_admission``'s rule: world size > 1 or an
accelerator. The world size of an EM backend is its number of worker *processes* (mp workers,
MPI ranks, dask workers, Ray actors, Spark task slots); ``local`` and ``model_parallel`` run
threads inside this one process (world size 1), like a single-process ``torch_native`` or
``megatron`` run, so they need no certificate. The world size is worked out *before* any worker
starts. Without a certificate for a no-mesh run the environment's ``MIXLE_PARALLEL_CERTIFICATE``
(meant for meshes) is not consulted; a certificate passed explicitly is always checked. With no
``admission=`` on a mesh, admission is automatic: a fitting signed certificate from the local
store, else EM is certified on the spot (the harness on two workers; a third party's registered backend as a
built-in, where the trust store's policy allows) and the result stored; under mpiexec
or torchrun (backends ``mpi``, ``torchrun``) it is certified in situ on the job's own ranks (``em_in_situ``),
after the ranks agreed on the decision (``em_agreement``): in situ only when every rank found no certificate and
every rank may certify; ranks whose views differ all end in the same ``NotAdmittedError``.
"""

from __future__ import annotations

import shlex
import sys
import sysconfig
from pathlib import Path
from typing import Any

from ....contracts import AdmissionMode, NotAdmittedError, ParallelPlan
from ....contracts.estimation import EncodedDataHandle
from ....verification.admission import AdmissionDecision, AutoCertify, require_admission
from ....verification.capability import active_harness_capability
from ....verification.rank_agreement import agreed_decision
from ....verification.source_binding import code_files, defining_module
from ...registry import get_encoded_data_backend
from ..backends.builtin_backends import BUILTIN_ENCODED_DATA_BACKENDS
from ..em_pass.runner_protocols import RunsOnRunner
from ..options import EncodedDataOptions
from .em_agreement import rank_exchange
from .em_in_situ import in_situ_certifier
from .executor_identity import EM_PRECISION, EMExecutorIdentity

__all__ = ["EM_PRECISION", "admit_encoded_data", "refuse_unbound_code"]

_AUTO_CERTIFIABLE = {"mp", "dask", "ray", "spark"}
"""Built-in backends certified on the spot when no stored certificate fits (those that need a cluster
the user set up are certified the same way, on a local one). A third party's registered backend is
certified on the spot too (``_third_party``), where the trust store's policy allows, like these."""

_BUILTIN = frozenset(BUILTIN_ENCODED_DATA_BACKENDS)
"""Built-in identities: their certify command needs no ``--import``."""

_IN_SITU = {"mpi", "torchrun"}
"""SPMD backends whose ranks a launcher started (mpiexec, torchrun): certified in situ, on those very ranks
(``em_in_situ``), when no stored certificate fits."""


def _third_party(executor: EMExecutorIdentity) -> bool:
    """A backend a third party registered (its own name, not a shadow of a built-in): certified on the spot."""
    return "[" not in executor.name and executor.name not in _BUILTIN


def _auto_certify(name: str) -> Any:
    """Certify EM on ``name`` on the spot: the harness on 2 workers, the gaussian-mixture workload."""

    def run() -> Any:
        from ....verification.harness.run import verify
        from ...registry import verification_target

        target = verification_target(name)
        report = verify(target, ParallelPlan(dp_replicate=2), precision=EM_PRECISION, workload="gaussian_mixture")
        return report.certify(target)

    return run


def _module_root(module: str) -> Path | None:
    """The folder a fresh process must have on its path to import ``module`` (None: not loaded from a file)."""
    top = sys.modules.get(module.split(".")[0])
    origin = getattr(top, "__file__", None)
    if origin:
        where = Path(origin).resolve()
        return where.parent.parent if where.name == "__init__.py" else where.parent
    paths = list(getattr(top, "__path__", ()))  # a namespace package
    return Path(paths[0]).resolve().parent if paths else None


def _path_prefix(module: str) -> str:
    """``PYTHONPATH=...`` to put before a command that imports ``module``, unless it is installed (the console
    script ``mixle-parallel`` does not look in the current directory)."""
    root = _module_root(module)
    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib", "stdlib")}
    if root is None or root in installed:
        return ""
    return f"PYTHONPATH={shlex.quote(str(root))}:$PYTHONPATH "


def _certify_command(executor: EMExecutorIdentity, workers: int) -> str:
    """How to certify ``executor``, runnable as printed: the CLI (with ``--import`` of the module that registers a
    third party's backend, and its folder on ``PYTHONPATH`` where it is not installed); in this process for a
    registration a new process cannot repeat (one that shadows a built-in, or one made in a script's ``__main__``)."""
    plan = f"dp_replicate={max(2, workers)}"
    module = None if executor.name.split("[")[0] in _BUILTIN else defining_module(
        get_encoded_data_backend(executor.backend))
    if "[" in executor.name or module == "__main__":
        return (f"mixle_parallel.verify({executor.backend!r}, ParallelPlan({plan}), precision='fp64', "
                f"workload='gaussian_mixture').certify({executor.backend!r}) in the process that registered it")
    imported = f"--import {module} " if module else ""
    return (f"{_path_prefix(module) if module else ''}mixle-parallel certify {imported}--backend {executor.backend} "
            f"--plan {plan} --workload gaussian_mixture")


def admit_encoded_data(
    name: str, *, admission: Any, workers: int, world_size: int, options: EncodedDataOptions | None = None
) -> tuple[AdmissionDecision, Any]:
    """The gate: an ``AdmissionDecision`` (and the signed certificate used), or ``NotAdmittedError``.

    ``name`` is the registry key that will run. With no ``admission=`` a fitting certificate comes from
    the local store, or EM is certified on the spot (once; about a second for ``mp``; a registration over
    an auto-certified built-in is certified the same way, under its own identity) and stored for next time.
    The ranks of a launched SPMD run (``mpi``, ``torchrun``; ``options`` names the handle's communicator) agree
    on the decision first (``em_agreement``): one decision, or the same refusal on every rank.
    """
    executor = EMExecutorIdentity(name)
    auto = (in_situ_certifier(name, world_size) if executor.name in _IN_SITU
            else _auto_certify(name) if executor.name.split("[")[0] in _AUTO_CERTIFIABLE or _third_party(executor)
            else None)
    plan = ParallelPlan(dp_replicate=max(1, workers))
    explicit = admission is not None and admission not in ("required", "auto", AdmissionMode.UNVERIFIED)
    if not explicit and admission != AdmissionMode.UNVERIFIED and world_size <= 1 \
            and active_harness_capability() is None:
        return AdmissionDecision(
            AdmissionMode.LOCAL,
            None,
            executor=executor.capabilities.name,
            plan=plan.describe(),
            precision=EM_PRECISION,
            notes=("one process on CPU: no certificate needed",),
        ), None
    command = _certify_command(executor, workers)

    def gate(certifier: AutoCertify | None) -> AdmissionDecision:
        try:
            return require_admission(executor, plan, EM_PRECISION, admission=admission, world_size=world_size,
                                     device_kind="cpu", comm_backend=executor.comm_backend, auto_certify=certifier,
                                     certify_command=command)
        except NotAdmittedError as exc:
            if any(command in reason for reason in exc.reasons):
                raise  # the gate's refusal already names the command: once is enough
            raise NotAdmittedError((*exc.reasons, f"certify with `{command}` (it stores the certificate where "
                                                  "this gate finds it), then run again")) from None

    exchange = rank_exchange(name, world_size, options)
    decision = gate(auto) if exchange is None else agreed_decision(gate, auto, exchange)
    return decision, decision.envelope if decision.certified else None


def _defined_in(cls: type) -> Path | None:
    origin = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return Path(origin).resolve() if origin else None


def refuse_unbound_code(handle: EncodedDataHandle, name: str, decision: AdmissionDecision) -> None:
    """A certified (or measured) handle whose class or runner is defined outside the code the certificate binds
    (the library and the factory's package) is refused: that code was never bound, so an edit to it would not
    require re-certification."""
    if decision.mode not in (AdmissionMode.CERTIFIED, AdmissionMode.VERIFYING):
        return
    bound = set(code_files(EMExecutorIdentity(name)))
    for cls in (type(handle), type(handle.runner if isinstance(handle, RunsOnRunner) else None)):
        where = _defined_in(cls)
        if cls is not type(None) and where not in bound:
            raise NotAdmittedError((
                f"check 'source_digest' failed: backend {name!r} runs {cls.__module__}.{cls.__qualname__} "
                f"(defined in {where or 'no file'}), outside the code its certificate binds (this library and "
                "the package of its registered factory)",
                "define the runner and handle classes in the factory's package, then re-certify"))
