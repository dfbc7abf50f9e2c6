"""The conformance suite for third-party backends.

``suite`` holds the checks and ``mixle-parallel conformance``; ``plugin`` is the pytest plugin
(entry point ``pytest11``) and ``checks`` the test module it collects.
"""

from .suite import (
    CHECKS,
    ConformanceFailure,
    main_conformance,
    parse_plan,
    run_conformance,
)

__all__ = ["CHECKS", "ConformanceFailure", "main_conformance", "parse_plan", "run_conformance"]
