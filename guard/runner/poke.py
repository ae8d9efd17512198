"""Writing a CPU outside-clock window's inputs into a worker's memory (``runner/staged.py``
and ``runner/pacing.py`` say why), as ``runner/peek.py`` reads its outputs out of it: through
``/proc/PID/mem``, which the guard, the worker's ancestor and of its user, may write as it may
read. A candidate's worker only says where its buffers lie: what the guard writes is the
trusted worker's draws, byte for byte, and a buffer that was not where it said holds other
inputs than the checks make again, which fails them.
"""

from __future__ import annotations

import os
from types import TracebackType

from .peek import PeekError

_CHUNK = 8 << 20


class Memory:
    """A worker's memory, open for writing its inputs (``/proc/PID/mem``, as ``runner/peek.py``
    reads it: the guard is the worker's ancestor and of its user)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.fd = os.open(f"/proc/{pid}/mem", os.O_WRONLY)
        except OSError as exc:  # the guard's own limit (a kernel that forbids it): not the worker's doing
            raise OSError(exc.errno, f"cannot write the worker's memory: {exc.strerror}") from None

    def write(self, data: bytes, writes: list[tuple[int, int, int]]) -> None:
        """Each ``(address, offset, nbytes)``: those bytes of ``data`` written at ``address``.
        PeekError where the memory cannot take them (the worker named it)."""
        view = memoryview(data)
        for address, offset, nbytes in writes:
            done = 0
            while done < nbytes:
                part = view[offset + done : offset + min(nbytes, done + _CHUNK)]
                try:
                    wrote = os.pwrite(self.fd, part, address + done)
                except OSError as exc:
                    raise PeekError(f"nothing writable at {address + done:#x} ({exc.strerror})") from None
                if wrote <= 0:
                    raise PeekError(f"nothing writable at {address + done:#x}")
                done += wrote

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        os.close(self.fd)
