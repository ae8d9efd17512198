"""File descriptors the guard holds of its workers (pidfds, pipes, sockets): waiting on one,
the pid a pidfd names, closing without caring whether it still is open."""

from __future__ import annotations

import os
import select


def readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` becomes readable within ``timeout`` seconds (a pidfd: its process ended).
    ``poll``, not ``select``: a guard's descriptors may be numbered past 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))


def host_pid(pidfd: int) -> int:
    """The pid, in this process's PID namespace, of the process a pidfd refers to."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        for line in f:
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                if pid > 0:
                    return pid
    raise OSError(f"pidfd {pidfd} names no process of this PID namespace")


def close_quietly(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
