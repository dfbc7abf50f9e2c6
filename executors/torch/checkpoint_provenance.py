"""The provenance statement of a checkpoint generation (torch-free): ``ROOT/gen-N.intoto.json`` beside it.

Its subjects are every file of the generation (manifest and signature included); its run id is the
one the generation's signed lineage names, so the statement, the manifest signature and the ledger
name the same run. ``TorchDistributedSession.save_checkpoint(..., provenance=True)`` calls it on
rank 0 once the generation is published (pass it on the run's final save, or on any generation).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...verification.keys import TrustStore
from ...verification.provenance import write_provenance
from .checkpoint_trust import generation_lineage

__all__ = ["write_checkpoint_provenance"]


def write_checkpoint_provenance(generation_dir: str | os.PathLike[str], *, ledger: str | os.PathLike[str],
                                data: Any = None, trust_store: TrustStore | None = None) -> Path:
    """Sign and write the provenance of a published generation (run id from its signed lineage); its path."""
    store = trust_store or TrustStore()
    _, lineage = generation_lineage(generation_dir, trust_store=store)
    return write_provenance(generation_dir, ledger=ledger, kind="training", run_id=lineage.run_id, data=data,
                            artefact_kind="checkpoint-generation", trust_store=store)
