"""The folder a guard's workers live in (their sources, builds and output files).

One per guard, in /dev/shm when it has room (candidate outputs travel through files there),
named after the guard's process: ``kernelarc-<pid>-<random>``. It is removed when the guard
closes, or when its object is collected or the interpreter exits without a close; a guard
killed outright (SIGKILL, a crash) cannot remove its own, so each new guard first removes the
folders of guards whose process is gone. Nothing is left behind for long either way: a
candidate's output files can be gigabytes of shared memory.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import weakref
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "kernelarc-"
_OWNED = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")
SHM = Path("/dev/shm")
SHM_ROOM_BYTES = 4 << 30


def root() -> Path:
    """/dev/shm when it has room, else the system's temporary folder."""
    try:
        st = os.statvfs(SHM)
        if st.f_bavail * st.f_frsize > SHM_ROOM_BYTES:
            return SHM
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        return True
    return True


def sweep(where: Path) -> list[Path]:
    """Remove the scratch folders under ``where`` that this user's guards left behind when
    their process died; returns them. A folder whose process still runs, or whose PID was
    taken by another process since, is kept (the safe side)."""
    removed: list[Path] = []
    uid = os.getuid()
    try:
        entries = list(where.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _OWNED.match(entry.name)
        if not match or _alive(int(match.group(1))):
            continue
        try:
            if entry.lstat().st_uid != uid or not entry.is_dir() or entry.is_symlink():
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    if removed:
        log.info("removed %d scratch folder(s) of guards that ended without cleaning up", len(removed))
    return removed


def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked child's exit must not take its parent's folder
        shutil.rmtree(path, ignore_errors=True)


class Scratch:
    """A guard's scratch folder: made (after a sweep) on construction, removed by ``remove``,
    by garbage collection of this object, or at interpreter exit."""

    def __init__(self, where: Path | None = None):
        base = where or root()
        sweep(base)
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
        self._finalizer = weakref.finalize(self, _remove, str(self.path), os.getpid())

    def remove(self) -> None:
        self._finalizer()
