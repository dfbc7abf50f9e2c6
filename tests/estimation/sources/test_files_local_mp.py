"""``files(...)`` on the in-process engines: the workers read the files, the bits are the in-memory ones."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel import encoded_data, files
from tests.estimation.backends import em_case
from tests.estimation.sources import source_case


def test_one_npy_file_fits_the_bits_of_the_rows_in_memory(tmp_path):
    source = source_case.write_files(str(tmp_path), "one_npy")
    assert source_case.run(source, "local", 1) == em_case.reference()
    assert source_case.run(source, "local", 3) == em_case.reference()


@pytest.mark.parametrize("layout", ["npy", "parquet"])
def test_a_source_of_several_files_fits_one_set_of_bits_on_local(tmp_path, layout):
    source = source_case.write_files(str(tmp_path), layout)
    reference = source_case.source_reference(source)
    assert source_case.run(source, "local", 2) == reference


def test_chunks_never_span_files(tmp_path):
    source = source_case.write_files(str(tmp_path), "npy")
    with encoded_data(source, backend="local", num_workers=1, chunk_size=250, admission="unverified") as handle:
        places = handle.places
        assert places is not None
        assert {(p.part, p.offset) for p in places} >= {(0, 0), (1, 0), (2, 0)}
        firsts = [0, 1300, 2900, 4000]
        for p in places:
            assert firsts[p.part] <= p.start < p.stop <= firsts[p.part + 1]
            assert p.stop - p.start <= 250
        assert handle.num_rows == 4000


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one_npy", "npy", "parquet"])
@pytest.mark.parametrize("n", [2, 3])
def test_mp_workers_read_the_files_and_fit_the_same_bits(tmp_path, layout, n):
    source = source_case.write_files(str(tmp_path), layout)
    reference = em_case.reference() if layout == "one_npy" else source_case.source_reference(source)
    assert source_case.run(source, "mp", n) == reference


def test_files_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="matches no"):
        files(str(tmp_path / "*.parquet"))
    (tmp_path / "rows.csv").write_text("1\n2\n")
    with pytest.raises(ValueError, match="name Parquet files"):
        files(str(tmp_path / "rows.csv"))
    np.save(tmp_path / "a.npy", np.zeros((3, 2)))
    np.save(tmp_path / "b.npy", np.zeros((3, 3)))
    with pytest.raises(ValueError, match="differ in format or columns"):
        files([str(tmp_path / "a.npy"), str(tmp_path / "b.npy")])


def test_a_non_finite_row_is_named_by_file_and_row(tmp_path):
    rows = em_case.data().copy()
    rows[1234] = np.nan
    np.save(tmp_path / "rows.npy", rows)
    with pytest.raises(ValueError, match=r"rows\.npy, row 1234"):
        source_case.run(files(str(tmp_path / "rows.npy")), "local", 1)


def test_parquet_columns_pick_the_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = em_case.data()
    pq.write_table(pa.table({"x": rows, "label": ["a"] * len(rows)}), tmp_path / "t.parquet", row_group_size=900)
    with pytest.raises(ValueError, match="not numeric"):
        files(str(tmp_path / "t.parquet"))
    assert source_case.run(files(str(tmp_path / "t.parquet"), columns=["x"]), "local", 2) == em_case.reference()


def test_a_source_on_a_backend_that_cannot_read_it_is_refused_naming_those_that_can(tmp_path):
    source = source_case.write_files(str(tmp_path), "one_npy")
    from mixle_parallel.executors.estimation.sources import rank_local

    with pytest.raises(ValueError, match="mpi, torchrun"):
        source_case.run(rank_local(em_case.data()), "local", 1)
    assert source is not None
