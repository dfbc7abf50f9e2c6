"""A heartbeat through the process group's store: a dead or hung rank is found in bounded time.

Every rank's thread writes ``{beat, step, phase, phase_age}`` under its rank every ``interval_s``
and reads the others'. A rank whose beat stops changing for ``dead_after_s`` is dead (its process
is gone or frozen); when some rank has been inside one phase of a step for ``hung_after_s``, the
rank outside a collective (in its forward or outside the session) that has been there longest is hung
(the others wait for it in a collective), or dead when its beat has also been still for half of
``dead_after_s`` (both deadlines run together when a rank freezes: which one passes first is chance). Ages
are each rank's own monotonic clock, so node clocks need not agree. What happens then is the
``on_failure(anomaly)`` callback's business (the session's: record it, then exit or raise).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from ...verification.health import Anomaly

PHASES = ("idle", "forward", "backward", "commit", "closed")
WAITING_PHASES = frozenset({"backward", "commit"})


class Heartbeat:
    """The beat of one rank plus its watch over every other rank; ``start``/``stop`` the daemon thread."""

    def __init__(self, store: Any, *, rank: int, world_size: int, on_failure: Callable[[Anomaly], None],
                 interval_s: float = 0.5, dead_after_s: float = 30.0, hung_after_s: float = 300.0) -> None:
        if not 0 < interval_s < dead_after_s:
            raise ValueError(f"need 0 < interval_s ({interval_s}) < dead_after_s ({dead_after_s})")
        if not hung_after_s > 0:
            raise ValueError(f"hung_after_s must be > 0, got {hung_after_s}")
        self.store, self.rank, self.world_size = store, rank, world_size
        self.on_failure = on_failure
        self.interval_s, self.dead_after_s, self.hung_after_s = interval_s, dead_after_s, hung_after_s
        self.step, self.phase = 0, "idle"
        self._phase_since = time.monotonic()
        self._beat = 0
        self._seen: dict[int, tuple[int, float]] = {}  # peer -> (last beat value, when it last changed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: Anomaly | None = None

    def set_phase(self, phase: str, step: int | None = None) -> None:
        """Called by the session as a step moves on (cheap: two attribute writes)."""
        self.phase, self._phase_since = phase, time.monotonic()
        if step is not None:
            self.step = step

    def start(self) -> None:
        """Write the first beat and start watching."""
        self._publish()
        self._thread = threading.Thread(target=self._run, name=f"mixle-heartbeat-{self.rank}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (it exits within one interval) and tell the peers this rank closed on purpose."""
        self._stop.set()
        try:
            self.phase = "closed"
            self._publish()
        except Exception:  # noqa: BLE001 - the store is already gone
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.interval_s)

    def _publish(self) -> None:
        self._beat += 1
        self.store.set(str(self.rank), json.dumps({
            "beat": self._beat, "step": self.step, "phase": self.phase,
            "phase_age": time.monotonic() - self._phase_since}))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._publish()
                found = self.check(time.monotonic())
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return
            if found is not None:
                self.failure = found
                self.on_failure(found)
                return

    def peers(self) -> dict[int, dict[str, Any]]:
        """The latest beat of every rank that has written one (this rank included)."""
        keys = [str(r) for r in range(self.world_size)]
        present = [k for k in keys if self.store.check([k])]
        return {int(k): json.loads(self.store.get(k)) for k in present}

    def check(self, now: float) -> Anomaly | None:
        """A dead or hung rank among the beats read now, else None."""
        beats = self.peers()
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            if beats.get(peer, {}).get("phase") == "closed":
                continue  # it closed its session; silence is expected
            beat = beats.get(peer, {}).get("beat", 0)
            last = self._seen.get(peer)
            if last is None or last[0] != beat:
                self._seen[peer] = (beat, now)
            elif now - last[1] > self.dead_after_s:
                return Anomaly(self.step, "dead_rank", now - last[1], self.dead_after_s, None, self.step, rank=peer,
                               detail=f"rank {peer} wrote no heartbeat for {now - last[1]:.1f} s "
                                      f"(last at step {beats.get(peer, {}).get('step')})")
        beats = {r: b for r, b in beats.items() if b["phase"] != "closed"}
        ages = {r: self._age(r, b, now) for r, b in beats.items()}
        if not any(ages[r] > self.hung_after_s for r, b in beats.items() if b["phase"] != "idle"):
            return None
        # a rank in backward/commit may be waiting inside a collective for the others; one in its forward
        # or outside the session is not (under DDP), so it is the one the others wait for
        free = [r for r, b in beats.items() if b["phase"] not in WAITING_PHASES]
        culprit = max(free or list(beats), key=ages.__getitem__)
        b = beats[culprit]
        silent = self._silent_s(culprit, now)
        if silent >= self.dead_after_s / 2:  # not beating either: frozen or gone, whichever deadline came first
            return Anomaly(self.step, "dead_rank", silent, self.dead_after_s, None, self.step, rank=culprit,
                           detail=f"rank {culprit} wrote no heartbeat for {silent:.1f} s while the others waited "
                                  f"for it (last at step {b['step']})")
        return Anomaly(b["step"], "hung_rank", ages[culprit], self.hung_after_s, None, self.step, rank=culprit,
                       detail=f"rank {culprit} has been in '{b['phase']}' after step {b['step']} for "
                              f"{ages[culprit]:.1f} s; the others wait for it")

    def _silent_s(self, rank: int, now: float) -> float:
        """Seconds since ``rank``'s beat last changed (as this rank saw it; 0 for itself)."""
        seen = self._seen.get(rank)
        return 0.0 if rank == self.rank or seen is None else now - seen[1]

    def _age(self, rank: int, beat: dict[str, Any], now: float) -> float:
        """How long ``rank`` has been in its phase now: its reported age plus the time since that report."""
        if rank == self.rank:
            return now - self._phase_since
        seen = self._seen.get(rank)
        return beat["phase_age"] + (now - seen[1] if seen is not None else 0.0)
