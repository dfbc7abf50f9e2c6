"""Rows from Arrow tables (Parquet row groups, Ray Data blocks): the numpy array an in-memory fit gets.

One scalar column gives a 1-D array (scalar rows), several scalar columns a 2-D array (one row per
record, columns in the order asked for), one list / fixed-size-list / tensor column a 2-D array of its
vectors. Nulls are refused naming the column and row, as a NaN is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["check_schema", "table_rows"]


def _is_vector(arrow_type: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
                or pa.types.is_fixed_size_list(arrow_type))


def _is_scalar(arrow_type: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
                or pa.types.is_boolean(arrow_type) or pa.types.is_decimal(arrow_type))


def check_schema(schema: Any, columns: Sequence[str] | None, where: str) -> tuple[str, ...]:
    """The columns to read from a table of ``schema``: ``columns`` (checked) or every column; numeric scalar
    columns, or one list column of numbers. Raises ``ValueError`` naming ``where`` and the column."""
    names = tuple(schema.names) if columns is None else tuple(columns)
    missing = [c for c in names if c not in schema.names]
    if missing:
        raise ValueError(f"{where} has no column(s) {missing}; its columns are {list(schema.names)}: pass "
                         "columns= naming some of them")
    if not names:
        raise ValueError(f"{where}: no columns to read; pass columns= naming the numeric columns")
    types = {c: schema.field(c).type for c in names}
    vectors = [c for c in names if _is_vector(types[c])]
    if vectors and len(names) > 1:
        raise ValueError(f"{where}: column(s) {vectors} hold lists; read one list column alone "
                         f"(columns=[{vectors[0]!r}]) or numeric scalar columns only")
    other = [c for c in names if not _is_vector(types[c]) and not _is_scalar(types[c])]
    if other:
        raise ValueError(f"{where}: column(s) {other} are not numeric ({[str(types[c]) for c in other]}); pass "
                         "columns= naming the numeric columns, or one column of number lists")
    return names


def _column_values(column: Any, name: str, where: str, first_row: int) -> np.ndarray:
    """One column as numpy: scalars 1-D, lists 2-D (every list of one length)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if column.null_count:
        row = int(np.flatnonzero(np.asarray(column.is_null()))[0])
        raise ValueError(f"{where}, row {first_row + row}, column {name!r} is null: EM needs values; drop or impute "
                         "the null rows first")
    if not _is_vector(column.type):
        return np.asarray(column.to_numpy(zero_copy_only=False))
    lengths = np.asarray(pc.list_value_length(column)) if not pa.types.is_fixed_size_list(column.type) else None
    width = column.type.list_size if lengths is None else (int(lengths[0]) if len(lengths) else 0)
    if lengths is not None and len(lengths) and not np.all(lengths == width):
        row = int(np.flatnonzero(lengths != width)[0])
        raise ValueError(f"{where}, row {first_row + row}, column {name!r} holds {int(lengths[row])} values where the "
                         f"first row holds {width}: every row needs the same length")
    values = column.flatten()
    if values.null_count:
        raise ValueError(f"{where}, column {name!r} holds null values inside its lists: EM needs values")
    return np.asarray(values.to_numpy(zero_copy_only=False)).reshape(len(column), width)


def table_rows(table: Any, columns: Sequence[str], where: str, first_row: int = 0) -> np.ndarray:
    """The rows of ``table`` (its ``columns``, checked by :func:`check_schema`) as one numpy array."""
    arrays = [_column_values(table.column(c), c, where, first_row) for c in columns]
    if len(arrays) == 1:
        return np.ascontiguousarray(arrays[0])
    return np.column_stack(arrays)
