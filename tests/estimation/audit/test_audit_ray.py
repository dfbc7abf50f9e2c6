"""The E-step SDC audit on three Ray actors of the session's local Ray (``ray_session``, tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.executors.estimation import encoded_data, fit
from mixle_parallel.verification import FaultInjector
from tests.estimation.audit.audit_cases import clean_fit, flip_trial, same_bits, start_model
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator

pytestmark = pytest.mark.slow
pytest.importorskip("ray")


def test_ray_clean_audits_and_attributed_flips(rows, ray_session):
    start = start_model(rows)
    clean = clean_fit(rows, start, 3)
    injector = FaultInjector()
    rng = np.random.default_rng(6)
    # admission="unverified": a test cluster; the audit is what is checked
    with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="ray", num_workers=3,
                      admission="unverified", audit_rate=1.0, fault_injector=injector, timeout=300) as handle:
        full = fit(handle, estimator(), max_its=3, delta=None, prev_estimate=start)
        assert full.audit_records and all(r.matched for r in full.audit_records)
        assert same_bits(full, clean)
        for _ in range(2):
            flip_trial(handle, injector, rng, start, clean, its=3)
