"""A command made ready to start in the sandbox, with what goes with it: the descriptors the
child must inherit (bwrap's seccomp filter and --info-fd, the caller's own), and the cgroups
it runs in.

Both the guard's candidate workers (``guard.runner.process``) and ``kernelarc verify``'s
child (``wholemodel.sandboxed``) start this way; one sequence, so that a step added to one
(the filter, the groups) is not missing from the other, and so that no descriptor or group
of the launch is left behind when a step fails (the callers' own steps around it are theirs
to clean: ``tests/test_sandbox_launch.py`` and ``test_verify_sandbox.py`` try both). Use:

    launch = prepare(policy, argv, env, tag="worker", tasks_limit=n, hand_over=[fd])
    try:
        proc = Popen(launch.cmd, pass_fds=launch.pass_fds, ...)
    except BaseException:
        launch.abandon()
        raise
    finally:
        launch.started()

The candidates' zygote (``guard.runner.cells``) is started by the zygote's own code, from a
wrapped command it is given; it needs no filter of bwrap's (each cell applies its own).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

from . import cgroups, seccomp
from .bwrap import wrap
from .policy import SandboxPolicy


@dataclass
class Launch:
    """``cmd`` to start with ``pass_fds`` inherited. The descriptors are this object's until
    ``started`` closes the child's ends (call it whether the start worked or not); ``info_r``
    (bwrap's report of the sandbox's init, where asked for) and ``group`` are then the
    caller's, or are released by ``abandon`` when the start failed."""

    cmd: list[str]
    pass_fds: list[int]
    group: cgroups.SandboxGroup | None = None
    info_r: int | None = None
    _child_ends: list[int] = field(default_factory=list)

    def started(self) -> None:
        """Close this process's copies of what the child inherited (idempotent)."""
        ends, self._child_ends = self._child_ends, []
        for fd in ends:
            with suppress(OSError):
                os.close(fd)

    def abandon(self) -> None:
        """The start failed: release everything, the child's ends, the info pipe, the groups."""
        self.started()
        if self.info_r is not None:
            with suppress(OSError):
                os.close(self.info_r)
            self.info_r = None
        if self.group is not None:
            self.group.close()
            self.group = None


def prepare(
    policy: SandboxPolicy,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    tag: str,
    tasks_limit: int,
    memory_bytes: int | None = None,
    hand_over: Sequence[int] = (),
    want_info: bool = False,
    workdir_tmpfs_bytes: int | None = None,
) -> Launch:
    """``argv`` wrapped in the sandbox ``policy`` describes, under the seccomp filter where this
    machine has one, and entered into new cgroups (``tag``, ``tasks_limit``, ``memory_bytes``:
    ``cgroups.SandboxGroup.make``) where they can be made. ``hand_over``: the caller's
    descriptors for the child (its number is in ``argv``); they are this call's from the start
    and closed by ``Launch.started``, or here if this raises. ``want_info``: a pipe for bwrap's
    --info-fd, whose read end is ``Launch.info_r``."""
    child_ends = list(hand_over)
    info_r = info_w = None
    group = None
    try:
        if want_info:
            info_r, info_w = os.pipe()
            child_ends.append(info_w)
        filter_r = seccomp.pipe()
        if filter_r is not None:
            child_ends.append(filter_r)
        cmd = wrap(
            policy,
            argv,
            env,
            info_fd=info_w,
            seccomp_fd=filter_r,
            workdir_tmpfs_bytes=workdir_tmpfs_bytes,
        )
        group = cgroups.SandboxGroup.make(tasks_limit, tag, memory_bytes)
        if group is not None:
            cmd = group.enter(cmd)
    except BaseException:
        Launch([], [], group, info_r, child_ends).abandon()
        raise
    return Launch(cmd, list(child_ends), group, info_r, child_ends)
