"""The timing slot: one per device, shared by every process on the machine.

A file lock: timing holds it exclusively; correctness runs hold it shared, so no timing
ever overlaps other guard work on the same device, whichever process (server, CLI) does it.
The kernel releases the lock when a process dies, so a crash never leaves it held.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
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

    @contextmanager
    def hold(self, exclusive: bool, on_wait: Callable[[], None] | None = None) -> Iterator[float]:
        """Yields the seconds spent waiting for the slot."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        t0 = time.monotonic()
        try:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, mode)
            yield time.monotonic() - t0
        finally:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
