"""The cgroups of one sandbox, made by the guard and entered before the sandbox's first
process runs: a cap on the tasks (processes and threads) it may hold, and a count of the CPU
time they used.

- **The cap** (the pids controller). A fork bomb fails inside its group (``fork`` returns
  EAGAIN) instead of taking every pid of the host, which would stop the guard's own workers
  and builds too. ``RLIMIT_NPROC`` cannot do this where the guard runs as root: the kernel
  does not hold uid 0 to it, capabilities or not.
- **The count** (cpuacct in cgroup v1, ``cpu.stat`` in v2). The kernel charges a group for
  every task in it as the task runs: a process that starts and ends inside a timed window,
  reaped by the kernel so that its CPU time reaches no parent, is counted all the same, which
  a reading of the process tree (``runner.tree_cpu``) cannot do.
- **The memory cap** (a CPU worker's, ``cpu_memory_limit_gb``). ``RLIMIT_AS`` caps each
  process alone: a candidate's processes together, and what it writes to its RAM-backed
  ``/tmp``, could take the host's memory. At the group's cap the kernel's OOM killer kills in
  the group only, and ``oom_kills()`` tells the guard why its worker died. Swap is capped
  with it where the kernel counts swap (``_no_swap``).
- **The freezer** (``CgroupFreezer``, cgroup v2's ``cgroup.freeze``): a stopped candidate's
  group is frozen too, so that a signal its own timer sends runs none of its code
  (``runner/tree_watch.py``).

Only where the guard may write the hierarchies: cgroup v1's, or a cgroup v2 subtree whose new
children get ``pids.max`` (delegated to the user, or the guard is root). Elsewhere
``SandboxGroup.make`` returns None and ``probe()`` says why; the guard says so at start-up
(``isolation.isolation_line``). Candidates never see the hierarchies (``policy.SYSFS_HIDDEN``).

A group is named ``kernelarc-<guard pid>-<tag>-...``: the groups of a guard that died without
removing them are removed by the next guard that makes one (``_sweep``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..processes import pid_exists

log = logging.getLogger(__name__)

PREFIX = "kernelarc-"
_STALE = re.compile(rf"^{PREFIX}(\d+)-")
# The shell writes its pid into each group's procs file (the arguments up to ``--``), then
# becomes the command: every process the command makes starts in the groups.
ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'
_count = itertools.count()


def default_limit(workers: int = 1) -> int:
    """Tasks for ``workers`` candidate workers: torch's thread pools grow with the cores, a
    build runs a compiler per core, and ``torch.compile`` a pool of up to 32 compiling
    processes of a few dozen threads each. A fork bomb stops there all the same."""
    return workers * (1024 + 16 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class Probe:
    """Where this process can make a sandbox's groups."""

    base: Path | None  # the pids hierarchy's folder for new groups; None: no cap here
    reason: str | None = None  # why not
    cpu_base: Path | None = None  # where CPU-time groups are made (v2: ``base`` itself)
    cpu_reason: str | None = None
    memory_base: Path | None = None  # where memory groups are made (v2: ``base`` itself)

    @property
    def available(self) -> bool:
        return self.base is not None


class SandboxGroup:
    """One sandbox's groups: ``path`` in the pids hierarchy, ``cpu_path`` where its CPU time
    is counted (the same folder in cgroup v2, another hierarchy's in v1, None where not)."""

    def __init__(self, path: Path, limit: int, cpu_path: Path | None = None, memory_path: Path | None = None) -> None:
        self.path, self.limit, self.cpu_path, self.memory_path = path, limit, cpu_path, memory_path

    @classmethod
    def make(cls, limit: int, tag: str = "worker", memory_bytes: int | None = None) -> SandboxGroup | None:
        """New groups under this process's own, the tasks capped at ``limit`` and, where
        ``memory_bytes`` is given and a memory group can be made, the memory they hold
        together at that; None where no pids group can be made (``probe()`` says why)."""
        found = probe()
        if found.base is None:
            return None
        made = _create(found.base, found.cpu_base, limit, tag)
        if isinstance(made, str):
            log.warning("no pids cap for a sandbox: %s", made)
            return None
        if memory_bytes is not None and found.memory_base is not None:
            why = _cap_memory(made, found.memory_base, memory_bytes)
            if why is not None:
                log.warning("no memory cap for a sandbox: %s", why)
        return made

    def _folders(self) -> list[Path]:
        extra = [p for p in (self.cpu_path, self.memory_path) if p is not None and p != self.path]
        return [self.path, *dict.fromkeys(extra)]

    def oom_kills(self) -> int:
        """Processes the kernel killed in the group for its memory cap (0 without one)."""
        if self.memory_path is None:
            return 0
        for name in ("memory.events", "memory.oom_control"):  # v2, v1
            try:
                text = (self.memory_path / name).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run from inside the groups: a shell writes its own pid into each, then
        execs ``argv``. A shell that cannot join runs nothing (the worker then fails to start,
        never uncapped or uncounted)."""
        return [
            "/bin/sh",
            "-c",
            ENTER,
            "kernelarc-enter",
            *(str(p / "cgroup.procs") for p in self._folders()),
            "--",
            *argv,
        ]

    def adopt(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the groups; OSError where it cannot. Its
        children made before stay where they are: move a process before it makes any."""
        for folder in self._folders():
            (folder / "cgroup.procs").write_text(str(pid))

    def cpu_ns(self) -> int | None:
        """CPU time every task that was ever in the group has used, in nanoseconds; None where
        it is not counted."""
        if self.cpu_path is None:
            return None
        try:
            if (self.cpu_path / "cpuacct.usage").exists():
                return int((self.cpu_path / "cpuacct.usage").read_text())
            for line in (self.cpu_path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) * 1000
        except (OSError, ValueError):
            return None
        return None

    def tasks(self) -> list[int]:
        return _listed(self.path)

    def kill_all(self) -> None:
        """SIGKILL every process in the group, each pinned first (``_kill``), leaving the group."""
        _kill(self.path, self.tasks())

    def close(self, timeout: float = 5.0) -> bool:
        """Kill every process left in the groups and remove them; False when one could not be
        removed in ``timeout`` (left for the next guard's sweep)."""
        removed = True
        for folder in reversed(self._folders()):  # the CPU one first: the pids one lists the tasks
            removed = _remove(folder, timeout) and removed
        return removed


# how long the freezer may take to report a group frozen (its tasks are stopped already)
FREEZER_WAIT_S = 2.0


class CgroupFreezer:
    """The kernel's freezer of a cgroup v2 group that holds the tree and nothing else:
    ``cgroup.freeze`` written, ``cgroup.events`` read until it says ``frozen 1``."""

    def __init__(self, group: Path) -> None:
        self.group = group
        self.on = False

    @classmethod
    def of(cls, group: Path | None) -> CgroupFreezer | None:
        return cls(group) if group is not None and (group / "cgroup.freeze").exists() else None

    def freeze(self) -> bool:
        """Freeze the group and wait until the kernel says it is; False (logged, the group
        thawed again) where it cannot."""
        try:
            (self.group / "cgroup.freeze").write_text("1")
        except OSError as exc:
            log.warning("cannot freeze cgroup %s: %s", self.group, exc)
            return False
        self.on = True
        deadline = time.monotonic() + FREEZER_WAIT_S
        while time.monotonic() < deadline:
            try:
                if "frozen 1" in (self.group / "cgroup.events").read_text().splitlines():
                    return True
            except OSError as exc:
                log.warning("cannot read cgroup %s: %s", self.group, exc)
                break
            time.sleep(0.001)
        log.warning("cgroup %s did not report frozen in %.0f s: signals alone hold it", self.group, FREEZER_WAIT_S)
        self.thaw()
        return False

    def thaw(self) -> None:
        if not self.on:
            return
        self.on = False
        try:
            (self.group / "cgroup.freeze").write_text("0")
        except FileNotFoundError:
            pass  # removed with its worker
        except OSError as exc:
            log.warning("cannot thaw cgroup %s: %s", self.group, exc)

    def kill(self) -> None:
        """Every task of the group, at once (``cgroup.kill``, Linux 5.14 on)."""
        try:
            (self.group / "cgroup.kill").write_text("1")
        except OSError:
            pass  # the pidfds do it one by one


def _remove(folder: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        left = _listed(folder)
        _kill(folder, left)
        try:
            folder.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if time.monotonic() > deadline:
                log.warning("cgroup %s not removed: %s (%d tasks)", folder, exc, len(left))
                return False
        time.sleep(0.02)


def _listed(folder: Path) -> list[int]:
    try:
        return [int(x) for x in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill(folder: Path, pids: list[int]) -> None:
    """SIGKILL each of ``pids`` that is still in the group. A pid read from the group may have
    ended and been given to another process by the time it is killed: each is pinned by a
    pidfd first, then killed only if the group still lists it (a pid listed after its pidfd was
    opened is the process that pidfd holds, or a new member of the group)."""
    pinned: dict[int, int] = {}
    try:
        for pid in pids:
            try:
                pinned[pid] = os.pidfd_open(pid)
            except OSError:  # gone already
                pass
        still = set(_listed(folder))
        for pid, fd in pinned.items():
            if pid in still:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except OSError:
                    pass
    finally:
        for fd in pinned.values():
            os.close(fd)


def _create(base: Path, cpu_base: Path | None, limit: int, tag: str) -> SandboxGroup | str:
    """Groups under ``base`` (and ``cpu_base``) capped at ``limit``, or why not."""
    name = f"{PREFIX}{os.getpid()}-{tag}-{next(_count)}-{uuid.uuid4().hex[:6]}"
    made: list[Path] = []
    try:
        for folder in dict.fromkeys(b for b in (base, cpu_base) if b is not None):
            _sweep(folder)
            (folder / name).mkdir()
            made.append(folder / name)
    except OSError as exc:
        for folder in made:
            _remove(folder, 0.0)
        return f"cannot make {base / name}: {exc.strerror}"
    group = SandboxGroup(base / name, limit, cpu_base / name if cpu_base is not None else None)
    try:
        (group.path / "pids.max").write_text(str(limit))
    except OSError as exc:  # a cgroup v2 subtree without the pids controller has no pids.max
        group.close()
        return f"no pids.max in {group.path} ({exc.strerror}): the pids controller is not enabled there"
    if group.cpu_path is not None and group.cpu_ns() is None:  # counted nowhere after all
        if group.cpu_path != group.path:
            _remove(group.cpu_path, 0.0)
        group.cpu_path = None
    return group


def _cap_memory(group: SandboxGroup, base: Path, nbytes: int) -> str | None:
    """Give ``group`` a memory group under ``base`` capped at ``nbytes``; why not, or None."""
    folder = base / group.path.name
    try:
        if folder != group.path:
            _sweep(base)
            folder.mkdir()
        if (folder / "memory.limit_in_bytes").exists():  # v1
            (folder / "memory.limit_in_bytes").write_text(str(nbytes))
        else:
            (folder / "memory.max").write_text(str(nbytes))
    except OSError as exc:
        if folder != group.path:
            _remove(folder, 0.0)
        return f"{folder}: {exc.strerror}"
    group.memory_path = folder
    _no_swap(folder, nbytes)
    return None


def _no_swap(folder: Path, nbytes: int) -> None:
    """The cap holds for swap too: without this, a group at its cap pushed its pages to swap
    and went on, slowing the host's other processes (the timed workers among them). v2: no
    swap at all; v1: memory and swap together at the cap. Where the kernel does not count
    swap (no such file), or the host has none, there is nothing to cap."""
    for name, value in (("memory.swap.max", 0), ("memory.memsw.limit_in_bytes", nbytes)):
        target = folder / name
        if not target.exists():
            continue
        try:
            target.write_text(str(value))
        except OSError as exc:
            log.warning("%s: swap not capped (%s)", target, exc.strerror)


def _sweep(base: Path) -> None:
    """Remove the groups of guards that are gone (a killed guard removes none of its own)."""
    try:
        entries = list(base.iterdir())
    except OSError:
        return
    for entry in entries:
        found = _STALE.match(entry.name)
        if found is not None and not pid_exists(int(found.group(1))):
            _remove(entry, 0.0)


@functools.cache
def probe() -> Probe:
    """Where this process can make a sandbox's groups (tried once per process)."""
    found = own_cgroup("pids")
    if isinstance(found, str):
        return Probe(None, found)
    cpu = own_cgroup("cpuacct")
    cpu_base, cpu_reason = (None, cpu) if isinstance(cpu, str) else (cpu, None)
    made = _create(found, cpu_base, 16, "probe")
    if isinstance(made, str):
        return Probe(None, made)
    if (why := _cannot_join(made)) is not None:  # a group a process cannot enter is no cap
        made.close()
        return Probe(None, why)
    if made.cpu_path is None:
        cpu_base, cpu_reason = None, cpu_reason or f"no CPU time counted in {cpu_base}"
    memory = own_cgroup("memory")
    memory_base = None
    if not isinstance(memory, str) and _cap_memory(made, memory, 1 << 30) is None and _cannot_join(made) is None:
        memory_base = memory
    made.close()
    return Probe(found, None, cpu_base, cpu_reason, memory_base)


def _cannot_join(group: SandboxGroup) -> str | None:
    """Why a process cannot enter ``group`` as a sandbox's first process does, or None (a
    cgroup v2 folder may take no process where its parent has controllers of its own)."""
    try:
        done = subprocess.run(group.enter(["/bin/true"]), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot start a process in {group.path}: {exc}"
    if done.returncode != 0:
        return f"a process cannot enter {group.path}: {(done.stderr or '').strip()[:200] or done.returncode}"
    return None


def own_cgroup(controller: str, proc: Path = Path("/proc/self")) -> Path | str:
    """The folder of this process's cgroup in the hierarchy of ``controller`` (v1's own
    hierarchy for it, else the unified one), or why there is none."""
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
        if controller in parts[1].split(","):
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
        if v1 is not None and fstype == "cgroup" and controller in options:
            return _under(Path(point), root, v1)
        if v1 is None and v2 is not None and fstype == "cgroup2":
            return _under(Path(point), root, v2)
    return f"no {controller} cgroup hierarchy is mounted"


def _under(point: Path, root: str, member: str) -> Path | str:
    """The member's folder in a hierarchy mounted at ``point`` from ``root``."""
    rel = os.path.relpath(member, root) if root != "/" else member.lstrip("/")
    if rel.startswith(".."):
        return f"this process's cgroup {member} is outside the mount of {root}"
    path = point / rel if rel not in ("", ".") else point
    return path if path.is_dir() else f"no folder for this process's cgroup at {path}"
