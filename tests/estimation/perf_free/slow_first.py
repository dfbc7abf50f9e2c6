"""A chunk function whose first call in a process is slow on one chunk (a fresh worker importing modules)."""

from __future__ import annotations

import time
from typing import Any

_CALLED = [False]


def slow_first_call(chunk: Any, payload: Any) -> int:
    """The chunk id; the process's first call sleeps ``payload`` seconds when it is for chunk 1."""
    first, _CALLED[0] = not _CALLED[0], True
    if first and chunk.chunk_id == 1:
        time.sleep(payload)
    return int(chunk.chunk_id)
