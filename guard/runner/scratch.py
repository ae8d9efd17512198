"""The folder a guard's workers live in (their sources, builds and output files).

One per guard, in /dev/shm when it has room (candidate outputs travel through files there),
named ``kernelarc-<pid>-<random>`` and holding a lock file that the guard keeps locked
(``flock``) for its whole life. It is removed when the guard closes, or when its object is
collected or the interpreter exits without a close. A guard killed outright (SIGKILL, a crash)
cannot remove its own, so each new guard first removes the folders whose lock it can take:
their guard is gone. A lock, not a PID, says so: guards in other PID namespaces (containers
sharing /dev/shm) see other PIDs, and a server that is PID 1 in its container always has the
same one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import tempfile
import time
import weakref
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "kernelarc-"
_OWNED = re.compile(rf"^{re.escape(PREFIX)}\d+-")
LOCK_NAME = ".guard.lock"
# a folder without its lock file yet: a guard between making the folder and locking it, or a
# version of the guard before locks; removed only when older than this
UNLOCKED_GRACE_S = 600.0
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


def _remove_if_abandoned(entry: Path) -> bool:
    """Remove ``entry`` if no guard holds its lock (taken, and held while removing)."""
    try:
        fd = os.open(entry / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            if time.time() - entry.lstat().st_mtime < UNLOCKED_GRACE_S:
                return False
        except OSError:
            return False
        shutil.rmtree(entry, ignore_errors=True)
        return True
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its guard is alive
            return False
        shutil.rmtree(entry, ignore_errors=True)
        return True
    finally:
        os.close(fd)


def sweep(where: Path) -> list[Path]:
    """Remove the scratch folders under ``where`` that this user's guards left behind when
    their process ended without removing them; returns them."""
    removed: list[Path] = []
    uid = os.getuid()
    try:
        entries = list(where.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if not _OWNED.match(entry.name):
            continue
        try:
            st = entry.lstat()
        except OSError:
            continue
        if st.st_uid != uid or entry.is_symlink() or not entry.is_dir():
            continue
        if _remove_if_abandoned(entry):
            removed.append(entry)
    if removed:
        log.info("removed %d scratch folder(s) of guards that ended without cleaning up", len(removed))
    return removed


def _remove(path: str, owner: int, lock_fd: int) -> None:
    if os.getpid() != owner:  # a forked child's exit must not take its parent's folder
        return
    shutil.rmtree(path, ignore_errors=True)
    try:
        os.close(lock_fd)
    except OSError:
        pass


class Scratch:
    """A guard's scratch folder: made (after a sweep) and locked on construction; removed by
    ``remove``, by garbage collection of this object, or at interpreter exit."""

    def __init__(self, where: Path | None = None):
        base = where or root()
        sweep(base)
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
        fd = os.open(self.path / LOCK_NAME, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._finalizer = weakref.finalize(self, _remove, str(self.path), os.getpid(), fd)

    def remove(self) -> None:
        self._finalizer()
