"""Writing a CPU outside-clock window's inputs into a stopped candidate worker's memory
(``runner/staged.py`` says why), as ``runner/peek.py`` reads its outputs out of it: through
``/proc/PID/mem``, which the guard, the worker's ancestor and of its user, may write as it
may read. The candidate's process only says where its buffers lie: what the guard writes is
the trusted worker's draws, byte for byte, and a buffer that was not where it said holds
other inputs than the checks make again, which fails them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from .peek import PeekError

_CHUNK = 8 << 20


def write_into(pid: int, source: Path, writes: Iterable[tuple[int, int, int]]) -> None:
    """Each ``(address, offset, nbytes)``: ``nbytes`` of the file ``source`` from ``offset``,
    written into ``pid``'s memory at ``address``. PeekError where the memory cannot be
    written as described."""
    try:
        mem = os.open(f"/proc/{pid}/mem", os.O_WRONLY)
    except OSError as exc:
        # the guard's own limit (a kernel that forbids it): not the candidate's doing
        raise OSError(exc.errno, f"cannot write the candidate worker's memory: {exc.strerror}") from None
    try:
        src = os.open(str(source), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            for address, offset, nbytes in writes:
                _copy_in(src, offset, mem, address, nbytes)
        finally:
            os.close(src)
    finally:
        os.close(mem)


def _copy_in(src: int, offset: int, mem: int, address: int, nbytes: int) -> None:
    done = 0
    while done < nbytes:
        data = os.pread(src, min(_CHUNK, nbytes - done), offset + done)
        if not data:
            raise OSError(f"the drawn inputs end at {offset + done} bytes, short of {offset + nbytes}")
        view = memoryview(data)
        while view:
            try:
                wrote = os.pwrite(mem, view, address + done)
            except OSError as exc:
                raise PeekError(f"nothing writable at {address + done:#x} ({exc.strerror})") from None
            if wrote <= 0:
                raise PeekError(f"nothing writable at {address + done:#x}")
            view = view[wrote:]
            done += wrote
