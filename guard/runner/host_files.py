"""A watch on the host's open-file table while candidate workers live.

The table is one for the host, and only CAP_SYS_ADMIN in the host's namespace passes its end
(``file-max``): a candidate that fills it fails every other sandbox's next ``open``, ``pipe``
or ``socket``, another guard's candidates and the confined agents among them (red team,
session 44). A candidate process holds at most 1024 descriptors (``sandbox.rlimits``), but a
file mapped and then closed stays in the table without one, 65,530 a process, and no cgroup
bounds them (``benchmarks/file_table_probe.py``). So the pool watches the table's fill, a
read of one small file twice a second, and when it passes ``stop_fraction`` of the table it
counts what each of its live candidate workers holds (descriptors and file mappings of its
sandbox's processes, from /proc/PID/fd and /proc/PID/map_files) and stops the one that holds
the most, where they together hold a real share of the files in use: its verdict says why.

What it does not do: stop a fill faster than its interval (the red team's rate, about
170,000 files a second, would take 7 s from half full to full on this machine; the watch
looks every 0.5 s), see candidates of another guard, or free what the table lost to
something else.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

FILE_NR = Path("/proc/sys/fs/file-nr")
INTERVAL_S = 0.5
# This pool's candidates together must hold this share of the files in use to be why the
# table is full (an honest torch worker maps about 350 segments of its libraries), and the
# one stopped at least MIN_CULPRIT_FILES: an attack split over several workers is stopped one
# worker a check, the largest first.
CULPRIT_SHARE = 0.25
MIN_CULPRIT_FILES = 10_000
# the most one check spends counting: a candidate chooses its mappings' paths, which made
# /proc/PID/maps take 80 s to read for one process (review, session 44); map_files costs the
# same whatever the paths, and a count stops once it has passed what it must show
COUNT_BUDGET_S = 2.0


class Watched(Protocol):
    """What the watch needs of a worker (``WorkerProcess``)."""

    @property
    def alive(self) -> bool: ...

    def process_ids(self) -> list[int]: ...

    def stop_for(self, reason: str) -> None: ...


def table(path: Path = FILE_NR) -> tuple[int, int]:
    """The files the host's table holds, and the most it may (``file-max``)."""
    allocated, _, most = path.read_text().split()
    return int(allocated), int(most)


def _entries(folder: str, enough: int) -> int:
    """Entries of ``folder``, counted up to ``enough``; 0 where it cannot be read."""
    count = 0
    try:
        with os.scandir(folder) as it:
            for _ in it:
                count += 1
                if count >= enough:
                    break
    except OSError:
        pass
    return count


def files_held(pid: int, enough: int = 1 << 62) -> int:
    """Files process ``pid`` keeps in the table, counted up to ``enough``: its descriptors and
    its mappings of files (each may hold one without a descriptor); 0 when it is gone."""
    held = _entries(f"/proc/{pid}/fd", enough)
    return held + _entries(f"/proc/{pid}/map_files", enough - held) if held < enough else held


class FileTableWatch:
    """Stops the candidate worker that fills the host's file table (see the module's text).
    ``workers``: the pool's live candidate workers, asked for at each check; ``stop_fraction``:
    the table's fill at which it looks; ``table_of``: the table's reading (a test's own)."""

    def __init__(
        self,
        workers: Callable[[], Iterable[Watched]],
        stop_fraction: float = 0.5,
        interval_s: float = INTERVAL_S,
        table_of: Callable[[], tuple[int, int]] = table,
    ) -> None:
        self._workers = workers
        self.stop_fraction = stop_fraction
        self.interval_s = interval_s
        self._table = table_of
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._said_full = False  # the table full with no culprit here: said once, until it empties

    def start(self) -> FileTableWatch:
        try:
            self._table()
        except (OSError, ValueError) as exc:  # no such file: nothing to watch here
            log.warning("the host's file table is not watched: %s", exc)
            return self
        self._thread = threading.Thread(target=self._run, name="kernelarc-file-table", daemon=True)
        self._thread.start()
        return self

    def close(self, wait: bool = True) -> None:
        self._done.set()
        if wait and self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a watch that fails must not end the guard
                log.exception("the file-table watch failed once")

    def check(self) -> Watched | None:
        """One look; the worker stopped, or None."""
        used, most = self._table()
        if used < self.stop_fraction * most:
            self._said_full = False
            return None
        deadline = time.monotonic() + COUNT_BUDGET_S
        share = CULPRIT_SHARE * used
        enough = max(share, MIN_CULPRIT_FILES)  # what a count must reach to show a culprit
        held: list[tuple[int, Watched]] = []
        for worker in list(self._workers()):
            count = 0
            for pid in worker.process_ids():
                count += files_held(pid, enough=max(1, int(enough) - count))
                if count >= enough or time.monotonic() > deadline:
                    break
            held.append((count, worker))
            if count >= enough or time.monotonic() > deadline:
                break  # this one is why, or no time is left to count the others
        count, worst = max(held, key=lambda pair: pair[0], default=(0, None))
        if worst is None or sum(c for c, _ in held) < share or count < MIN_CULPRIT_FILES:
            if not self._said_full:
                log.warning(
                    "the host's file table is %d of %d full, and no candidate of this guard holds much of it",
                    used,
                    most,
                )
                self._said_full = True
            return None
        worst.stop_for(
            f"stopped by the guard: its processes held {count} or more of the host's {most} open files, "
            f"which were {used} in use (a sandbox must not fill the table every process shares)"
        )
        return worst
