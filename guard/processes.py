"""Facts about other processes of this host that several parts of the guard ask."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists in this PID namespace (one owned by another user
    counts: the signal's permission error says it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
