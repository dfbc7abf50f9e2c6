"""The harness capability: how the verification harness's own runs pass the admission gate.

The harness must run executors on real meshes before any certificate exists. It does so holding a
``HarnessCapability`` that the harness claims once per process when its worker module is imported
(``claim_harness_capability``; a second claim under the same holder is refused). Code enters
``harness_admitted(capability)`` with that object; the gate admits the run in mode ``verifying``
and every receipt names the holder. Nothing in the environment (no variable, no file) confers it:
a child process is admitted only because the harness's own code, running in it, enters the context.
"""

from __future__ import annotations

import contextlib
import contextvars
import secrets
from collections.abc import Iterator

__all__ = ["HarnessCapability", "active_harness_capability", "claim_harness_capability", "harness_admitted"]


class HarnessCapability:
    """An unforgeable-by-environment token: only objects minted by ``claim_harness_capability`` count."""

    __slots__ = ("_token", "holder")

    def __init__(self, holder: str, token: str) -> None:
        self.holder = holder
        self._token = token

    def __repr__(self) -> str:
        return f"HarnessCapability(holder={self.holder!r})"

    @property
    def receipt_note(self) -> str:
        """What receipts made under it say."""
        return f"admitted by the harness capability held by {self.holder}"


_MINTED: dict[str, HarnessCapability] = {}
_ACTIVE: contextvars.ContextVar[HarnessCapability | None] = contextvars.ContextVar(
    "mixle_parallel_harness_capability", default=None)


def claim_harness_capability(holder: str) -> HarnessCapability:
    """Mint the capability for ``holder``, once per process; a second claim raises ``RuntimeError``."""
    if holder in _MINTED:
        raise RuntimeError(f"the harness capability for {holder!r} was already claimed in this process")
    capability = HarnessCapability(holder, secrets.token_hex(16))
    _MINTED[holder] = capability
    return capability


def _genuine(capability: object) -> bool:
    if not isinstance(capability, HarnessCapability):
        return False
    minted = _MINTED.get(capability.holder)
    return minted is capability


@contextlib.contextmanager
def harness_admitted(capability: HarnessCapability) -> Iterator[None]:
    """Run the enclosed code as the harness's own verification run; refuses anything but a minted capability."""
    if not _genuine(capability):
        raise PermissionError("harness_admitted() needs the capability the verification harness claimed; "
                              "outside the harness pass a certificate or admission='unverified'")
    token = _ACTIVE.set(capability)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_harness_capability() -> HarnessCapability | None:
    """The capability in force for this context, or None (never from the environment)."""
    capability = _ACTIVE.get()
    return capability if _genuine(capability) else None
