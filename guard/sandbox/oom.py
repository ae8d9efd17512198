"""Candidates go first when the host runs out of memory, where that cannot be turned around.

A GPU worker has no memory cgroup where the machine delegates none, and a CPU one's cap is
its own: a candidate that fills the host's memory leaves the kernel's OOM killer to choose
among the guard, its server, the other candidates and the user's processes, by size. Where
the guard holds ``CAP_SYS_RESOURCE``, every sandbox starts at ``OOM_SCORE_ADJ`` (the most the
kernel takes), inherited by all its processes, so that they are killed before anything
outside (the guard then reports the worker's death).

Only there: a privileged write also sets the least value the process may lower itself to,
and an unprivileged one does not. Without the capability (an ordinary user; root in a
container that leaves it out, as on this project's CPU and GPU machines) a candidate could
lower its own score back to 0 while every other sandbox stayed at 1000, and a hog that did
would have the OOM killer take the other candidates' workers first (review, session 44). The
sandboxes are then left at their parent's score, where they were before this.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

OOM_SCORE_ADJ = 1000
CAP_SYS_RESOURCE = 24
SHELL = "/bin/sh"

# a shell sets its own score, then becomes the sandbox; a write that fails does not stop the
# start (the score is a preference of the OOM killer's, not a bound), nor is it said
FIRST = f'echo {OOM_SCORE_ADJ} 2>/dev/null >/proc/self/oom_score_adj; exec "$@"'


def has_capability(bit: int, status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process holds capability ``bit`` (its effective set)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


@functools.cache
def applies() -> bool:
    """Whether sandboxes start at the highest score: the score then holds (see above), and
    there is a shell to set it (none is needed otherwise)."""
    return has_capability(CAP_SYS_RESOURCE) and os.access(SHELL, os.X_OK)


def killed_first(argv: Sequence[str]) -> list[str]:
    """``argv`` run with the OOM killer's highest score, inherited by every process it makes,
    where that ``applies``; else ``argv`` as it is."""
    if not applies():
        return list(argv)
    return [SHELL, "-c", FIRST, "kernelarc-oom-first", *argv]
