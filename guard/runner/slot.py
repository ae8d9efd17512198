"""The timing slot: one per device, shared by every process on the machine.

A file lock: timing holds it exclusively; correctness runs hold it shared, so no timing
ever overlaps other guard work on the same device, whichever process (server, CLI) does it.
The kernel releases the lock when a process dies, so a crash never leaves it held.

A hold is re-entrant within a thread: an evaluation holds the slot across its gates
(``cascade/slot_tenure.py``), and a gate that asks for what is already held gets it at once. A
lock taken again on a second descriptor would wait for the first: flock's locks belong to
the open file, not the process.

Timing waits its turn, never longer: flock serves no one in order, and shared holders that
overlap kept an exclusive request out for as long as they went on (a red team's two
sharers of 4 s, staggered by 2 s: the exclusive hold came only when they stopped, 3 of 3;
session 40). So a second lock, the turnstile, orders them: a request for the exclusive hold
keeps the turnstile while it waits, and a shared request passes through the turnstile
before it takes the slot. Shared holders that came first finish; none that comes later
starts before the exclusive hold is taken.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ENV_LOCK_DIR = "KERNELARC_LOCK_DIR"


def lock_dir() -> Path:
    d = Path(os.environ.get(ENV_LOCK_DIR) or Path(tempfile.gettempdir()) / "kernelarc-locks")
    d.mkdir(parents=True, exist_ok=True)
    return d


class TimingSlot:
    def __init__(self, device_key: str):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device_key)
        self.path = lock_dir() / f"slot-{safe}.lock"
        self.turnstile = lock_dir() / f"slot-{safe}.turnstile"
        self._held = threading.local()  # this thread's hold: "exclusive", "shared" or none

    def held(self) -> str | None:
        """How this thread holds the slot now: "exclusive", "shared" or None."""
        return getattr(self._held, "mode", None)

    @contextmanager
    def hold(self, exclusive: bool, on_wait: Callable[[], None] | None = None) -> Iterator[float]:
        """Yields the seconds spent waiting for the slot. Within a hold of this thread that
        covers the request, nothing more is taken; a shared hold cannot become exclusive
        inside itself (its holder must let it go first, and decide what runs meanwhile)."""
        want = "exclusive" if exclusive else "shared"
        current = self.held()
        if current == "exclusive" or current == want:
            yield 0.0
            return
        if current is not None:
            raise RuntimeError("the timing slot is held shared: let it go before asking for it exclusively")
        said: list[bool] = []

        def wait(fd: int, op: int) -> None:
            try:
                fcntl.flock(fd, op | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None and not said:
                    said.append(True)
                    on_wait()
                fcntl.flock(fd, op)

        t0 = time.monotonic()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            gate = os.open(self.turnstile, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                # exclusive: keep the turnstile until the slot is ours; shared: only pass it
                wait(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                if not exclusive:
                    fcntl.flock(gate, fcntl.LOCK_UN)
                wait(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            finally:
                os.close(gate)  # lets the turnstile go
            self._held.mode = want
            yield time.monotonic() - t0
        finally:
            self._held.mode = None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
