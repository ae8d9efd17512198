"""Waiting on a file descriptor (a pidfd, a pipe, a socket) with a timeout."""

from __future__ import annotations

import select


def readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` becomes readable within ``timeout`` seconds (a pidfd: its process ended).
    ``poll``, not ``select``: a guard's descriptors may be numbered past 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))
