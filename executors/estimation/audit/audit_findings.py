"""What the EM audit found, kept in the order found until the ledger's owner takes it.

The audit writes no ledger: its ``SDCAuditRecord`` values (the auditor's records) and its ``AuditNote`` values
(a lost or quarantined worker) wait in a :class:`Findings` until the pass hands them to the handle's ledger
(``estep.write_findings``), even when the pass raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ....contracts import SDCAuditRecord

__all__ = ["AuditEvent", "AuditNote", "Findings"]


@attrs.frozen
class AuditNote:
    """A ledger note the audit found (a lost or quarantined worker); the handle writes it."""

    message: str
    fields: Mapping[str, Any] = attrs.field(factory=dict)


AuditEvent = SDCAuditRecord | AuditNote
"""What ``Findings.take`` returns, in the order found."""


class Findings:
    """The audit's records and notes not yet taken, in the order found; ``records`` is the auditor's own list."""

    def __init__(self, records: Sequence[SDCAuditRecord]) -> None:
        self._records = records
        self._events: list[AuditEvent] = []
        self._taken = 0  # auditor records already moved to _events

    def _sync(self) -> None:
        fresh = self._records[self._taken:]
        self._taken += len(fresh)
        self._events.extend(fresh)

    def note(self, message: str, **fields: Any) -> None:
        """Add a note after every record found so far."""
        self._sync()
        self._events.append(AuditNote(message, fields))

    def take(self) -> tuple[AuditEvent, ...]:
        """The records and notes found since the last call, in order."""
        self._sync()
        events, self._events = tuple(self._events), []
        return events
