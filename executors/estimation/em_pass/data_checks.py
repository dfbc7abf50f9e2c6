"""Checks of the rows given to ``encoded_data``, run before any worker starts.

Empty data, NaN or infinite values (naming the first bad row and column) and complex, object or
string values where the encoder needs real numbers raise ``ValueError`` saying what to do, rather
than fitting defaults or failing deep inside an M-step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_rows", "needs_numbers"]


def needs_numbers(encoder: Any) -> bool:
    """Whether ``encoder`` encodes rows of real numbers (its class says ``NUMERIC_ROWS = True``)."""
    return bool(getattr(type(encoder), "NUMERIC_ROWS", False))


def _encoder_of(estimator: Any, model: Any, encoder: Any) -> Any:
    for source, method in ((encoder, None), (model, "encoder"), (estimator, "encoder")):
        if source is None:
            continue
        if method is None:
            return source
        try:
            return getattr(source, method)()
        except Exception:  # noqa: BLE001 - a model without an encoder is reported where it is used
            return None
    return None


def _first_bad(values: np.ndarray) -> tuple[int, int]:
    bad = np.argwhere(~np.isfinite(values.reshape(values.shape[0], -1)))[0]
    return int(bad[0]), int(bad[1])


def _check_numeric(data: Any) -> None:
    arr = data if isinstance(data, np.ndarray) else None
    if arr is None:
        try:
            arr = np.asarray(data)
        except (TypeError, ValueError):
            return  # ragged rows: the encoder reports its own shape error
    kind = arr.dtype.kind
    if kind == "c":
        raise ValueError("data is complex; EM models here need real numbers: pass the real part (x.real) or "
                         "the magnitude (abs(x)) explicitly")
    if kind in "OUSV":
        what = {"O": "object", "U": "string", "S": "bytes", "V": "structured"}[kind]
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"data holds {what} values where numbers are needed (dtype {arr.dtype}); convert the "
                             "rows to a float array first (numpy.asarray(rows, dtype=float))") from None
    if kind in "fc" or kind in "OUSV":
        arr = np.asarray(arr, dtype=np.float64)
        if not np.all(np.isfinite(arr)):
            row, column = _first_bad(arr)
            value = arr.reshape(arr.shape[0], -1)[row, column]
            raise ValueError(f"data row {row}, column {column} is {value}: EM needs finite values; drop or impute "
                             "the non-finite rows first")


def check_rows(data: Any, *, estimator: Any = None, model: Any = None, encoder: Any = None) -> None:
    """Raise ``ValueError`` for rows no fit can use (see the module doc); ``data=None`` is left alone."""
    if data is None:
        return
    try:
        n = len(data)
    except TypeError:
        return  # count_rows reports unsized data
    if n == 0:
        raise ValueError("data has no rows; pass at least one row to fit")
    if needs_numbers(_encoder_of(estimator, model, encoder)):
        _check_numeric(data)
