"""Ray sources: a ``ray.data.Dataset`` and ``files(...)``, read by the actors from the object store / the files."""

from __future__ import annotations

import numpy as np
import pytest

from tests.estimation.backends import em_case
from tests.estimation.sources import source_case

pytestmark = pytest.mark.slow


def test_a_dataset_of_one_block_fits_the_bits_of_the_rows_in_memory(ray_session):
    rows = em_case.data()
    dataset = ray_session.data.from_numpy(rows)
    for n in (1, 2):
        assert source_case.run(dataset, "ray", n) == em_case.reference()


def test_a_dataset_of_several_blocks_fits_the_bits_of_the_same_parts_as_files(ray_session, tmp_path):
    import pandas as pd

    parts = np.split(em_case.data(), source_case.SPLITS)
    dataset = ray_session.data.from_pandas([pd.DataFrame({"x": p}) for p in parts])
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    assert source_case.run(dataset, "ray", 2) == reference


@pytest.mark.parametrize("layout", ["one_npy", "parquet"])
def test_files_are_read_by_the_actors(ray_session, tmp_path, layout):
    source = source_case.write_files(str(tmp_path), layout)
    reference = em_case.reference() if layout == "one_npy" else source_case.source_reference(source)
    for n in (1, 2):
        assert source_case.run(source, "ray", n) == reference


def test_a_dataset_on_another_backend_is_refused_naming_ray(ray_session):
    with pytest.raises(ValueError, match="backends that take it: ray"):
        source_case.run(ray_session.data.from_numpy(np.zeros(4)), "local", 1)
