"""The run ledger: append-only, hash-chained JSON Lines.

``chain`` writes it (``Ledger``) and reads it back; ``seal`` signs run ends and the head file
``<ledger>.head``; ``verify`` checks a ledger end to end and names the first bad entry
(``mixle-parallel audit LEDGER [--since HEAD]``).
"""

from .chain import Ledger, LedgerEntry, LedgerError, iter_ledger, read_ledger, truncate_torn_tail
from .seal import LEDGER_HEAD_TYPE, head_path, read_head
from .verify import LedgerFault, LedgerReport, main_audit, verify_ledger

__all__ = [
    "LEDGER_HEAD_TYPE", "Ledger", "LedgerEntry", "LedgerError", "LedgerFault", "LedgerReport", "head_path",
    "iter_ledger", "main_audit", "read_head", "read_ledger", "truncate_torn_tail", "verify_ledger",
]
