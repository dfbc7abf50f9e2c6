"""pytest plugin: ``pytest --mixle-backend NAME|module:attr`` runs the conformance suite against a backend.

Registered through the ``pytest11`` entry point (``mixle_parallel =
"mixle_parallel.verification.conformance.plugin"``); without ``--mixle-backend`` it does nothing.
With it and no test paths on the command line, only the conformance checks are collected;
with paths, the checks are added to them. Options: ``--mixle-plan dp_shard=2``,
``--mixle-precision fp32``, ``--mixle-workload mlp``, ``--mixle-skip-harness``, and
``--mixle-import MODULE`` (repeatable: a module that registers the backend's name, imported first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CHECKS_MODULE = Path(__file__).with_name("checks.py")
"""The bundled test module holding one test per conformance check."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the --mixle-* options."""
    group = parser.getgroup("mixle-parallel", "mixle-parallel backend conformance")
    group.addoption("--mixle-backend", default=None,
                    help="backend under test: a registered training or EM backend name, or 'package.module:attribute'")
    group.addoption("--mixle-import", action="append", default=[], metavar="MODULE",
                    help="import MODULE first (repeatable): a module that registers the backend's name")
    group.addoption("--mixle-plan", default=None, help="plan for the harness check, e.g. 'dp_shard=2'")
    group.addoption("--mixle-precision", default=None, help="precision for the harness check")
    group.addoption("--mixle-workload", default=None, help="workload for the harness check (mlp, tiny_lm, ...)")
    group.addoption("--mixle-skip-harness", action="store_true", help="skip the check that starts processes")


def pytest_configure(config: pytest.Config) -> None:
    """Collect the bundled checks when a backend is named."""
    if not config.getoption("mixle_backend", default=None):
        return
    checks = str(CHECKS_MODULE)
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        if checks not in config.args:
            config.args.append(checks)
    else:
        config.args[:] = [checks]


@pytest.fixture(scope="session")
def mixle_conformance(request: pytest.FixtureRequest) -> Any:
    """The shared ConformanceContext for the backend named by --mixle-backend."""
    from ..backend_names import import_modules
    from .suite import ConformanceContext, parse_plan

    spec = request.config.getoption("mixle_backend")
    if not spec:
        pytest.skip("no --mixle-backend given")
    import_modules(request.config.getoption("mixle_import"))
    return ConformanceContext(spec, parse_plan(request.config.getoption("mixle_plan")),
                              request.config.getoption("mixle_precision"),
                              request.config.getoption("mixle_workload"))
