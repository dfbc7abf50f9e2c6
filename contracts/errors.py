"""Exceptions shared by every layer: what was wrong and what to do about it."""

from __future__ import annotations


class ContractError(ValueError):
    """A document or value does not satisfy a contract; the message names the field path."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class CapabilityError(ValueError, NotImplementedError):
    """A plan or precision asks a backend for something it does not execute.

    A ``ValueError`` (the plan is invalid for this backend) and a ``NotImplementedError`` (what
    mixle 0.8.2 raises for an axis a backend does not execute), so either ``except`` catches it.
    """


class ContractTypeError(TypeError, ValueError):
    """A value of the wrong type (a float or bool where an int belongs): a ``TypeError``, and a ``ValueError``
    (what mixle 0.8.2 raises for it), so either ``except`` catches it."""


class UnknownBackendError(KeyError, ValueError):
    """A backend name that is not registered: a ``KeyError`` (a registry lookup) and a ``ValueError``
    (what mixle 0.8.2 raises), with the registered names in the message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NotAdmittedError(RuntimeError):
    """An executor was asked to run on a real device mesh without an accepted certificate."""

    def __init__(self, reasons: tuple[str, ...] | list[str] | str) -> None:
        if isinstance(reasons, str):
            reasons = (reasons,)
        self.reasons = tuple(reasons)
        detail = "; ".join(self.reasons)
        # a reason that already names the exact command keeps it the only one in the message
        source = ("that command" if "`mixle-parallel certify " in detail or "`PYTHONPATH=" in detail
                  else "`mixle-parallel certify`")
        super().__init__(
            f"not admitted: {detail}. A signed certificate comes from {source} (kept in the "
            "local store, where the gate finds it, or passed as certificate=); "
            "admission='unverified' runs anyway with that recorded in every receipt."
        )


class UnusedParametersError(RuntimeError, ValueError):
    """Trainable parameters got no gradient under DDP, which reduces every one of them each step: named, with
    what to do (``find_unused_parameters=True``, ``requires_grad=False`` on them, or FSDP2)."""

    def __init__(self, names: tuple[str, ...] | list[str], *, where: str = "the step") -> None:
        self.names = tuple(names)
        shown = ", ".join(self.names[:20]) + (f" and {len(self.names) - 20} more" if len(self.names) > 20 else "")
        super().__init__(
            f"parameters {shown} got no gradient in {where}, and DDP (dp_replicate>1 without sharding) reduces "
            "every trainable parameter each step. Pass find_unused_parameters=True to prepare() (DDP then finds "
            "them each step), set requires_grad=False on them, or shard with FSDP2 (plan dp_shard>1), which needs "
            "neither")


class MissingExtraError(ImportError):
    """An optional engine is not installed; the message names the extra that installs it."""

    def __init__(self, module: str, extra: str) -> None:
        self.module = module
        self.extra = extra
        super().__init__(
            f"{module} is not installed; install it with `pip install 'mixle-parallel[{extra}]'`"
        )


class UnknownMemoryFootprintError(ValueError):
    """A size the planner needs cannot be known from what the object declares; the message names the path
    and the fix (``mixle_memory_nbytes()``, a ``decomposition()`` or ``params()``)."""
