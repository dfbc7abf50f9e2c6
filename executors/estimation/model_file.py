"""``save_model(model, path, ledger=...)``: a fitted EM model as a folder, with its signed provenance beside it.

mixle 0.8.2 has no ``save_model``: its models are saved as text with ``mixle.stats.dump_models``.
Here a model folder holds ``model.json``: a mixle model's ``dump_models`` JSON (read back with
``mixle.stats.load_models``), or, for a built-in model, its type, ``repr``, parameter digest and
parameters (arrays as dtype, shape and values). With ``ledger=`` (the fit's ledger) the folder gets
``<path>.intoto.json`` beside it: an in-toto statement listing its files, binding the ledger's signed
head, the run's certificate, the audit summary and ``data``'s identity (``verification.provenance``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...verification.keys import TrustStore
from ...verification.provenance import write_provenance
from ...verification.safe_files import write_atomic
from .compat.mixle_interop import unwrap_mixle
from .models._base import model_digest

__all__ = ["MODEL_FILE", "save_model"]

MODEL_FILE = "model.json"
"""The file a model folder holds."""


def _plain(value: Any) -> Any:
    """Parameters as JSON: arrays as dtype, shape and values; tuples as lists."""
    if isinstance(value, np.ndarray):
        return {"dtype": value.dtype.str, "shape": list(value.shape), "values": value.ravel().tolist()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _document(model: Any) -> str:
    inner = unwrap_mixle(model)
    if type(inner).__module__.split(".")[0] == "mixle":
        from mixle.stats import dump_models

        return dump_models(inner)
    params = getattr(model, "params", None)
    if not callable(params):
        raise TypeError(f"save_model takes a fitted model (a built-in or mixle distribution), got "
                        f"{type(model).__name__}, which has no params()")
    return json.dumps({"format": "mixle-parallel-model", "version": 1, "type": type(model).__qualname__,
                       "repr": repr(model), "digest": model_digest(model), "params": _plain(params())},
                      indent=1, sort_keys=True, allow_nan=False) + "\n"


def save_model(model: Any, path: str | os.PathLike[str], *, ledger: str | os.PathLike[str] | None = None,
               data: Any = None, run_id: str | None = None, trust_store: TrustStore | None = None) -> Path:
    """Write ``model`` into the folder ``path`` (``model.json``); with ``ledger`` (the fit's ledger) also its signed
    provenance ``<path>.intoto.json``; ``data`` (the fit's data: an array, paths, a ``files(...)`` source, a
    collection) is identified in it. Returns the folder."""
    if (data is not None or run_id is not None) and ledger is None:
        raise ValueError("data= and run_id= go into the provenance statement, which binds the fit's ledger: "
                         "pass ledger= as well")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / MODEL_FILE, _document(model))
    if ledger is not None:
        write_provenance(folder, ledger=ledger, kind="em", run_id=run_id, data=data, artefact_kind="model",
                         trust_store=trust_store)
    return folder
