"""Candidates go first when the host runs out of memory.

A GPU worker has no memory cgroup where the machine delegates none (the lent GPU machines
do not), and a CPU one's cap is its own: a candidate that fills the host's memory would
otherwise leave the kernel's OOM killer to choose among the guard, its server and the
user's other processes, by size alone. Every sandbox starts at ``OOM_SCORE_ADJ`` (the most
the kernel takes), inherited by all its processes, so that they are killed before anything
outside (the guard then reports the worker's death).

Raising the value needs no privilege. Lowering it below the least a privileged process set
needs CAP_SYS_RESOURCE: where the guard runs as root, its write sets that least too, and a
candidate cannot undo it; for any other user a candidate can lower it back to its parent's
value, which leaves it where it was without this (docs/guard.md).
"""

from __future__ import annotations

from collections.abc import Sequence

OOM_SCORE_ADJ = 1000

# a shell sets its own score, then becomes the sandbox; a write that fails (no /proc) does not
# stop the start: the score is a preference of the OOM killer's, not a bound
FIRST = f'echo {OOM_SCORE_ADJ} > /proc/self/oom_score_adj 2>/dev/null; exec "$@"'


def killed_first(argv: Sequence[str]) -> list[str]:
    """``argv`` run with the OOM killer's highest score, inherited by every process it makes."""
    return ["/bin/sh", "-c", FIRST, "kernelarc-oom-first", *argv]
