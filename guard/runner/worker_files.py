"""The guard's own access to files in a worker's folder, which a candidate's worker may write:
never by a path a link could redirect, never opening what is not a plain file.

A candidate can replace anything in its folder between two of the guard's looks: a file by a
link to the workspace's secret (which the guard, unconfined, could read and then put in a
verdict), by a FIFO (an ``open`` that blocks forever), by a link to ``/dev/zero``. Every
access here opens the folder without following a link, then the file relative to it, without
following one and without blocking, and reads only a plain file of bounded size (red teams,
sessions 27 and 32).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotAPlainFile(OSError):
    pass


def _name(name: str) -> str:
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not a file name: {name!r}")
    return name


def _open_folder(folder: Path) -> int:
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def remove(folder: Path, name: str) -> None:
    """Delete ``name`` in ``folder`` (a link itself, never its target); nothing if it is gone."""
    name = _name(name)
    fd = _open_folder(folder)
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def read_plain(folder: Path, name: str, limit: int) -> bytes:
    """The content of ``name`` in ``folder``, a plain file of at most ``limit`` bytes;
    ``NotAPlainFile`` for anything else (a link, a FIFO, a device, a folder, too large)."""
    name = _name(name)
    dir_fd = _open_folder(folder)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise NotAPlainFile(f"{folder / name}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAPlainFile(f"{folder / name} is not a plain file")
        if st.st_size > limit:
            raise NotAPlainFile(f"{folder / name} holds {st.st_size} bytes, more than {limit}")
        return os.read(fd, limit + 1)[:limit]
    finally:
        os.close(fd)
