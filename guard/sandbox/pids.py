"""A cap on the tasks (processes and threads) a sandbox may hold: a pids cgroup that the guard
makes for each sandbox it starts (a candidate worker's own, or the candidates' zygote with
its cells), entered before the sandbox's first process runs. A fork bomb then fails inside
its group (``fork`` returns EAGAIN) instead of taking every pid of the host, which would stop
the guard's own workers and builds too. ``RLIMIT_NPROC`` cannot do this where the guard runs
as root: the kernel does not hold uid 0 to it, capabilities or not.

Only where the guard may write a pids cgroup: cgroup v1's pids hierarchy, or a cgroup v2
subtree whose new children get ``pids.max`` (delegated to the user, or the guard is root).
Elsewhere ``PidsGroup.make`` returns None and ``probe()`` says why; the guard says so at
start-up (``isolation.isolation_line``).

A group is named ``kernelarc-<guard pid>-<tag>``: the groups of a guard that died without
removing them are removed by the next guard that makes one (``_sweep``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "kernelarc-"
_STALE = re.compile(rf"^{PREFIX}(\d+)-")
ENTER = 'echo $$ > "$0" && exec "$@"'  # the shell joins the group, then becomes the command
_count = itertools.count()


def default_limit(workers: int = 1) -> int:
    """Tasks for ``workers`` candidate workers: torch's thread pools grow with the cores, a
    build runs a compiler per core, and an honest worker never came near this."""
    return workers * (512 + 8 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class Probe:
    base: Path | None  # where groups are made; None: nowhere
    reason: str | None = None  # why not

    @property
    def available(self) -> bool:
        return self.base is not None


class PidsGroup:
    """One pids cgroup and its cap. ``enter(argv)`` is a command that joins the group and then
    runs ``argv``; ``close()`` kills what is left in it and removes it."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path, self.limit = path, limit

    @classmethod
    def make(cls, limit: int, tag: str = "worker") -> "PidsGroup | None":
        """A new group under this process's own pids cgroup, capped at ``limit`` tasks; None
        where none can be made (``probe()`` says why)."""
        base = probe().base
        if base is None:
            return None
        made = _create(base, limit, tag)
        if isinstance(made, str):
            log.warning("no pids cap for a sandbox: %s", made)
            return None
        return made

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run from inside the group: a shell writes its own pid into the group and
        then execs ``argv``, so every process the command makes starts in it. A shell that
        cannot join runs nothing (the worker then fails to start, never uncapped)."""
        return ["/bin/sh", "-c", ENTER, str(self.procs), *argv]

    def adopt(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group; OSError where it cannot. Its
        children made before stay where they are: move a process before it makes any."""
        self.procs.write_text(str(pid))

    def tasks(self) -> list[int]:
        try:
            return [int(x) for x in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def peak(self) -> int | None:
        """The most tasks the group held at once (kernels that keep ``pids.peak``)."""
        try:
            return int((self.path / "pids.peak").read_text())
        except (OSError, ValueError):
            return None

    def close(self, timeout: float = 5.0) -> bool:
        """Kill every process left in the group and remove it; False when it could not be
        removed in ``timeout`` (left for the next guard's sweep)."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.tasks()
            self._kill(left)
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if time.monotonic() > deadline:
                    log.warning("pids cgroup %s not removed: %s (%d tasks)", self.path, exc, len(left))
                    return False
            time.sleep(0.02)

    def _kill(self, pids: list[int]) -> None:
        """SIGKILL each of ``pids`` that is still in the group. A pid read from the group may
        have ended and been given to another process by the time it is killed: each is pinned
        by a pidfd first, then killed only if the group still lists it (a pid listed after its
        pidfd was opened is the process that pidfd holds, or a new member of the group)."""
        pinned: dict[int, int] = {}
        try:
            for pid in pids:
                try:
                    pinned[pid] = os.pidfd_open(pid)
                except OSError:  # gone already
                    pass
            still = set(self.tasks())
            for pid, fd in pinned.items():
                if pid in still:
                    try:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    except OSError:
                        pass
        finally:
            for fd in pinned.values():
                os.close(fd)


def _create(base: Path, limit: int, tag: str) -> PidsGroup | str:
    """A group under ``base`` capped at ``limit``, or why not."""
    _sweep(base)
    path = base / f"{PREFIX}{os.getpid()}-{tag}-{next(_count)}-{uuid.uuid4().hex[:6]}"
    try:
        path.mkdir()
    except OSError as exc:
        return f"cannot make {path}: {exc.strerror}"
    group = PidsGroup(path, limit)
    try:
        (path / "pids.max").write_text(str(limit))
    except OSError as exc:  # a cgroup v2 subtree without the pids controller has no pids.max
        group.close()
        return f"no pids.max in {path} ({exc.strerror}): the pids controller is not enabled there"
    return group


def _sweep(base: Path) -> None:
    """Remove the groups of guards that are gone (a killed guard removes none of its own)."""
    try:
        entries = list(base.iterdir())
    except OSError:
        return
    for entry in entries:
        found = _STALE.match(entry.name)
        if found is None or _alive(int(found.group(1))):
            continue
        PidsGroup(entry, 0).close(timeout=0.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def probe() -> Probe:
    """Where this process can make pids groups (tried once per process)."""
    found = own_pids_cgroup()
    if isinstance(found, str):
        return Probe(None, found)
    made = _create(found, 1, "probe")
    if isinstance(made, str):
        return Probe(None, made)
    made.close()
    return Probe(found)


def own_pids_cgroup(proc: Path = Path("/proc/self")) -> Path | str:
    """The folder of this process's cgroup in the hierarchy that has the pids controller
    (v1's pids hierarchy, else the unified one), or why there is none."""
    try:
        memberships = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError as exc:
        return f"cgroups unreadable: {exc}"
    v1 = v2 = None
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "pids" in parts[1].split(","):
            v1 = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        root, point, fstype = fields[3], fields[4], fields[dash + 1]
        options = fields[dash + 3].split(",") if len(fields) > dash + 3 else []
        if v1 is not None and fstype == "cgroup" and "pids" in options:
            return _under(Path(point), root, v1)
        if v1 is None and v2 is not None and fstype == "cgroup2":
            return _under(Path(point), root, v2)
    return "no pids cgroup hierarchy is mounted"


def _under(point: Path, root: str, member: str) -> Path | str:
    """The member's folder in a hierarchy mounted at ``point`` from ``root``."""
    rel = os.path.relpath(member, root) if root != "/" else member.lstrip("/")
    if rel.startswith(".."):
        return f"this process's cgroup {member} is outside the mount of {root}"
    path = point / rel if rel not in ("", ".") else point
    return path if path.is_dir() else f"no folder for this process's cgroup at {path}"
