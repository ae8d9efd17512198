"""A watch on the host's open-file table while candidate workers live.

The table is one for the host, and only CAP_SYS_ADMIN in the host's namespace passes its end
(``file-max``): a candidate that fills it fails every other sandbox's next ``open``, ``pipe``
or ``socket``, another guard's candidates and the confined agents among them (red team,
session 44). A candidate process holds at most 1024 descriptors (``sandbox.rlimits``), but a
file mapped and then closed stays in the table without one, 65,530 a process, and no cgroup
bounds them (``benchmarks/file_table_probe.py``). So the pool watches the table's fill, a
read of one small file twice a second, and when it passes ``stop_fraction`` of the table it
counts what each of its live candidate workers holds (descriptors and file mappings of its
sandbox's processes) and stops the one that holds the most, if that is a real share of the
files in use: its verdict says why.

What it does not do: stop a fill faster than its interval (the red team's rate, about
170,000 files a second, would take 7 s from half full to full on this machine; the watch
looks every 0.5 s), see candidates of another guard, or free what the table lost to
something else.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

FILE_NR = Path("/proc/sys/fs/file-nr")
INTERVAL_S = 0.5
# a worker holding less than this share of the files in use is not why the table is full:
# none is stopped (an honest torch worker maps a few thousand segments of its libraries)
CULPRIT_SHARE = 0.25


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


def files_held(pid: int) -> int:
    """Files process ``pid`` keeps in the table: its descriptors and its mappings of files
    (each of which may hold one without a descriptor); 0 when it is gone."""
    held = 0
    try:
        held += len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/maps", "rb") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) >= 5 and fields[4] != b"0":  # an inode: a file's mapping
                    held += 1
    except OSError:
        pass
    return held


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
            return None
        held = [(sum(files_held(pid) for pid in w.process_ids()), w) for w in list(self._workers()) if w.alive]
        if not held:
            return None
        count, worst = max(held, key=lambda pair: pair[0])
        if count < CULPRIT_SHARE * used:
            log.warning(
                "the host's file table is %d of %d full, and no candidate of this guard holds much of it", used, most
            )
            return None
        worst.stop_for(
            f"stopped by the guard: its processes held {count} of the host's {most} open files, "
            f"which were {used} in use (a sandbox must not fill the table every process shares)"
        )
        return worst
