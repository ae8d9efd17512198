"""What an agent may take of the machine: less CPU than the guard's timed workers, a cap on
its processes and, where asked, on its memory.

An agent runs its own tests, builds and benchmarks on the machine the guard judges on. On a
GPU the guard's figures are the device's (with the outside clock as their bound), but on a
CPU an agent's busy loop shares the cores with the worker being timed and moves its figures;
and an agent's fork bomb or runaway build could take every pid or the memory of the host.

- **CPU**: every process of the agent runs at ``nice`` (default 19, the lowest priority):
  under the kernel's fair scheduler a task at nice 19 weighs 15 against 1024 at nice 0, the
  guard's. A busy loop beside a timed one on the same core made it 1.87-2.01x slower at nice 0,
  1.10-1.19x at nice 10 and 0.99-1.04x at 19 (``benchmarks/nice_share.py``). A confined agent
  cannot take it back (an unconfined one run by root can): lowering a nice value needs
  ``CAP_SYS_NICE`` in the host's user namespace, which a confined agent has none of, or an
  ``RLIMIT_NICE`` above 0, which is 0 by default. ``nice -n`` adds to the launcher's own value,
  so the step is what brings the agent to ``nice``.
- **Tasks**: a pids cgroup (``guard.sandbox.cgroups``): a fork bomb fails inside it.
- **Memory**: ``memory_gb``, where given: the kernel's OOM killer then kills in the agent's
  group only. None by default, since an agent's client and its builds need what they need.

Disk is not limited: the agent's clone and HOME are host folders. Where no cgroup can be made
here, only the nice value holds, and ``line`` says so.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from guard.sandbox import cgroups

log = logging.getLogger(__name__)


class AgentLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nice: int = Field(19, ge=0, le=19, description="the agent's processes' nice value (0: the guard's)")
    memory_gb: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="memory an agent's processes may hold together"
    )
    tasks: int | None = Field(None, ge=64, description="processes and threads (None: the guard's worker default)")

    def task_limit(self) -> int:
        return self.tasks or cgroups.default_limit()


class Limited:
    """An agent's command with its limits applied, and the cgroup it runs in (closed, and every
    process left in it killed, when the agent ends)."""

    def __init__(self, argv: Sequence[str], limits: AgentLimits):
        self.limits = limits
        memory = int(limits.memory_gb * 2**30) if limits.memory_gb else None
        self.group = cgroups.SandboxGroup.make(limits.task_limit(), "agent", memory)
        cmd = list(argv)
        if self.group is not None:
            cmd = self.group.enter(cmd)
        nice = shutil.which("nice")
        # ``nice -n`` adds to the launcher's own value: what brings the agent to ``limits.nice``
        step = limits.nice - os.nice(0)
        self.niced = step > 0 and nice is not None
        if self.niced:
            cmd = [str(nice), "-n", str(step), *cmd]
        elif limits.nice:
            log.warning("no nice command here: agents run at the guard's priority")
        self.argv = cmd

    @property
    def line(self) -> str:
        """What holds, for the agent's command.json."""
        parts = [f"nice {self.limits.nice}" if self.niced or os.nice(0) >= self.limits.nice else "not niced"]
        if self.group is None:
            parts.append(f"no cgroup ({cgroups.probe().reason or 'none could be made'})")
        else:
            parts.append(f"tasks <= {self.limits.task_limit()}")
            if self.limits.memory_gb:
                parts.append(
                    f"memory <= {self.limits.memory_gb:g} GB" if self.group.memory_path else "memory not capped here"
                )
        return ", ".join(parts)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
