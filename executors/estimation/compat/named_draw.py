"""mixle's named draw over our audit (``AuditedMPEncodedData``): the pass names the chunks it audits on a peer.

mixle 0.8.2 draws each round's audited chunks from the handle's ``rng`` and replays them on a peer worker in
the same round (a witness on a mismatch, the faulty worker quarantined: ``peer_replay``), so the backend sees
which chunks are audited and could spare exactly those. Where the audit has a reference, the same pass
therefore also runs the secret sample's reference audit: every folded group commits to its chunks' digests,
the sample is drawn after the commitments (``EMAudit.draw_sample``), the named and the secret chunks are
compared with their references and the secret ones' groups opened (``estep``), so sparing the named chunks
does not pass. Without a reference the named chunks' peer replays are the audit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ....verification.sdc.em import ChunkAudit
from ..audit.commitments import check_commitments
from ..audit.peer_replay import backend_pass
from ..em_pass.estep import judge_against_reference, open_folded_groups

if TYPE_CHECKING:
    from ..audit.sdc_audit import EMAudit

__all__ = ["ChunkDraw", "NamedDrawPass"]

ChunkDraw = Callable[..., tuple[int, ...]]
"""``draw(iteration, num_chunks, *, first_of_fit=False)``: the chunks a round names (mixle's draw)."""


class NamedDrawPass:
    """The pass of an audit whose chunks are named ahead by ``draw`` (module doc); ``EMAudit.named_draw``."""

    def __init__(self, draw: ChunkDraw) -> None:
        self.draw = draw

    def audited_chunks(self, iteration: int, num_chunks: int, *, first_of_fit: bool = False) -> tuple[int, ...]:
        """The chunks this round names (the draw's, never the secret sample's)."""
        return self.draw(iteration, num_chunks, first_of_fit=first_of_fit)

    def run(self, audit: EMAudit, payload: tuple[Any, Any], iteration: int, num_chunks: int, encoder: Any,
            first_of_fit: bool) -> tuple[list[Any], tuple[ChunkAudit, ...]]:
        """The entries of one pass (chunk order, for ``fold_pass``) and the audit's outcomes: the named chunks'
        first, then the secret sample's."""
        audited = self.audited_chunks(iteration, num_chunks, first_of_fit=first_of_fit)
        if audit.reference is None:
            return backend_pass(audit, payload, iteration, num_chunks, audited)
        n = num_chunks
        token = audit.pass_token(iteration)
        entries, outcomes = backend_pass(audit, payload, iteration, n, audited, token)
        owners = audit.chunk_owners(n)
        check_commitments(entries, n, backend=audit.runner.name, iteration=iteration, owners=owners)
        secret = audit.draw_sample(n, owners, first_of_fit=first_of_fit)
        chunks = tuple(sorted(set(audited) | set(secret)))
        refs = audit.references(chunks, encoder, *payload)  # mixle's chunks, then the secret ones
        outcomes += judge_against_reference(audit, entries, refs, chunks, owners, payload, iteration, None)
        folds = open_folded_groups(audit, entries, payload, iteration, secret, owners, token)
        return entries, outcomes + folds
