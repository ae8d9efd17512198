"""The candidates' zygote of one worker pool: started inside the OS sandbox, with the pool's
folder as the one its workers' folders are in; each worker it forks makes its cell there
(``guard.sandbox.cell``) before anything of the candidate's runs.

Only on the CPU, and only where bwrap is the sandbox: a GPU's worker must make its own CUDA
context from a new interpreter (``zygote``), and without a sandbox there is nothing to share
safely. ``start`` raises ``zygote.ZygoteError`` where the zygote cannot start; the pool then
starts its candidate workers from new interpreters, each in a sandbox of its own, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from .. import sandbox
from . import zygote

log = logging.getLogger(__name__)

# what the zygote needs inside its sandbox, over that sandbox's namespaces only: to mount each
# worker's cell, and to empty the worker's bounding set before it runs
ZYGOTE_CAPS = ("CAP_SYS_ADMIN", "CAP_SETPCAP")
LOG_NAME = "cells-zygote.log"
# workers' worth of tasks for a zygote's own pids group: the zygote, the child that waits on
# each cell, and each cell until the guard has moved it into a group of its own
# (``WorkerProcess._cap_cell``), before it is sent anything
CELLS_TASKS = 3


def usable(device: str, isolation: sandbox.Isolation) -> bool:
    return device == "cpu" and isolation.mechanism == "bubblewrap"


def start(
    root: Path,
    device: str,
    env: dict[str, str],
    protect: Sequence[Path],
    expose: Sequence[Path],
    caps: Sequence[str] = ZYGOTE_CAPS,
    tasks_limit: int | None = None,
    memory_bytes: int | None = None,
) -> zygote.Zygote:
    """A zygote in a sandbox that shows ``root`` (the pool's folder) writable, and what a
    candidate worker's sandbox shows read-only (``SandboxPolicy.for_worker``). ``env``: the
    workers' environment but what differs per worker (its folder's caches).
    The zygote enters a cell once before it says ready, and does not start where it cannot
    (``caps``: what it keeps; fewer than it needs is how a test makes that happen).
    ``tasks_limit``: the processes and threads the zygote's pids group may hold (by default
    what ``CELLS_TASKS`` workers get, ``cgroups.default_limit``): each cell starts in it and is
    moved to a group of its own before any candidate code runs in it; ``memory_bytes``: what
    the zygote's group may hold (None: no memory cap)."""
    root = Path(root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    policy = sandbox.SandboxPolicy.for_worker(root, device, protect=protect, expose=expose, env=env)

    def wrap(cmd: list[str]) -> list[str]:
        return sandbox.wrap(policy, cmd, env, keep_caps=caps)

    tasks = sandbox.cgroups.SandboxGroup.make(
        tasks_limit or sandbox.cgroups.default_limit(CELLS_TASKS), "cells", memory_bytes
    )
    return zygote.Zygote(env, root / LOG_NAME, args=["--cells", str(root)], wrap=wrap, tasks=tasks)
