"""Stopping a worker's whole process tree while another worker measures something that it
must not disturb (the loop cost for the outside clock): a stopped process cannot submit GPU
work or burn CPU from a thread it left running.

A tree read once and stopped pid by pid can be escaped: a chain of processes that each fork
their successor and exit always has a live member newer than the list (red team, session 11,
``tests/cheats/escapes_freeze_by_fork_chain.py``). So the tree is read again and again, each
new process stopped, until a whole reading finds nothing new and nothing running; a tree that
keeps growing is refused. And what the tree did while stopped is checked after the block: its
CPU time (each process's own and what it reaped of exited children) must not have grown, no
process may have appeared, and none may have gone: a stopped process can be continued by a
signal no process of the tree has to send (a POSIX timer armed before the stop), and one whose
parent ignores SIGCHLD is reaped by the kernel the moment it exits, its CPU time with it (red
team, second pass: ``tests/test_redteam_freeze.py``). Under the sandbox every process of the
candidate stays in the tree (its PID namespace's init, the sandbox, reaps orphans).

Seen only after the block, such a tree ran through all of it; so the block is also watched
while it lasts, and the tree killed at its first wake-up (``runner/tree_watch.py``; red team,
session 41), ``Freeze.killed`` saying so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .proc_tree import run_ns, stat_fields, tree
from ..sandbox.cgroups import CgroupFreezer
from .tree_watch import Pins, TreeWatch, kill_tree

log = logging.getLogger(__name__)

# a clock tick of CPU time (USER_HZ): what /proc's utime and stime count in
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


class FreezeError(Exception):
    """The tree could not be brought to a stop; ``growing`` when new processes kept appearing."""

    def __init__(self, message: str, growing: bool) -> None:
        super().__init__(message)
        self.growing = growing


@dataclass
class Freeze:
    """What the block saw: the pids stopped, and (set when the block ends, before anything is
    continued) the CPU time the tree used meanwhile and the processes that appeared in it;
    ``killed`` as soon as the watch killed the tree (what it saw, and when)."""

    pids: list[int] = field(default_factory=list)
    ran_s: float = 0.0
    appeared: list[int] = field(default_factory=list)
    vanished: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)  # not stopped any more when the block ended
    woke: list[int] = field(default_factory=list)  # ran at all meanwhile: a thread ran, appeared or exited
    killed: str | None = None  # the watch saw the tree run and killed it: what it saw
    watch_error: str | None = None  # the watch failed (logged): the block was checked after it only
    frozen_by_cgroup: bool = False  # the kernel's freezer held the tree's cgroup too

    def escaped(self) -> str | None:
        """Why the tree was not still while stopped, or None."""
        if self.killed is not None:  # what it used then left with the processes
            return f"the candidate's processes ran while the guard had them stopped: {self.killed}"
        if self.ran_s <= _TICK_S and not (self.appeared or self.vanished or self.running or self.woke):
            return None
        return (
            f"the candidate's processes used {self.ran_s * 1e3:.0f} ms of CPU time while the guard had "
            f"them stopped; {len(self.woke)} ran, {len(self.appeared)} appeared, {len(self.vanished)} exited "
            f"and {len(self.running)} were running at the end"
        )


def _stopped(pid: int) -> bool:
    """Whether every thread of the process has taken the stop (or it is a zombie, or gone).
    SIGSTOP stops a process's threads one by one, and a thread inside a driver call (D)
    finishes it first: only once each is stopped does none of them run, so that any run
    time the scheduler counts afterwards is the process waking up."""
    try:
        tasks = [t.name for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return True
    for tid in tasks:
        fields = stat_fields(pid, tid)
        if fields and fields[0] not in "TtZX":
            return False
    return True


def cpu_seconds(pids: list[int]) -> float:
    """CPU time of ``pids``: each one's own (all its threads) and what it has reaped of its
    exited children."""
    ticks = 0
    for p in pids:
        fields = stat_fields(p)
        if fields and len(fields) > 14:
            ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return ticks * _TICK_S


def woke(before: dict[int, int], after: dict[int, int]) -> bool:
    """Whether a stopped process ran between two readings of its threads' run times: one of
    them ran, or one appeared or exited (neither can happen without running)."""
    return before.keys() != after.keys() or any(after[t] > ns for t, ns in before.items())


def _stop_all(pid: int, stopped: list[int], pins: Pins, timeout_s: float) -> None:
    """SIGSTOP every process of ``pid``'s tree, reading it again until a whole reading finds
    nothing new and nothing still running (SIGSTOP is delivered asynchronously)."""
    seen = set(stopped)
    deadline = time.monotonic() + timeout_s
    while True:
        pids = tree(pid)
        new = [p for p in pids if p not in seen]
        for p in new:
            if not pins.signal(p, signal.SIGSTOP):
                continue
            seen.add(p)
            stopped.append(p)
        running = [p for p in pids if not _stopped(p)]
        if not new and not running:
            return
        if time.monotonic() > deadline:
            growing = bool(new)
            why = "new processes kept appearing" if growing else f"processes {running} did not stop"
            raise FreezeError(f"the candidate's process tree could not be stopped in {timeout_s:.0f} s: {why}", growing)
        if not new:
            time.sleep(0.0005)


@contextlib.contextmanager
def frozen(
    pid: int | None, timeout_s: float = 5.0, *, group: Path | None = None, watch: bool = True
) -> Iterator[Freeze]:
    """SIGSTOP ``pid``'s whole tree for the duration of the block (every process seen stopped
    before it starts), SIGCONT after. Raises FreezeError when the tree cannot be stopped; the
    yielded ``Freeze`` says, once the block is over, whether anything ran meanwhile.
    ``group``: a cgroup v2 folder that holds the tree and nothing else, frozen too where it
    has a freezer. ``watch``: kill the tree as soon as it runs (``TreeWatch``); off for the
    guard's own trusted worker, which nothing condemns."""
    state = Freeze()
    if pid is None:
        yield state
        return
    pins = Pins()
    freezer = CgroupFreezer.of(group)
    watcher: TreeWatch | None = None

    def release() -> None:  # the watch ended (it may be killing) before anything is continued
        if watcher is not None:
            watcher.stop()
        if freezer is not None:
            freezer.thaw()
        _continue(state.pids, pins)
        pins.close()

    try:
        _stop_all(pid, state.pids, pins, timeout_s)
        if freezer is not None:
            state.frozen_by_cgroup = freezer.freeze()
        before = set(tree(pid))
        ns_before = _settled_run_ns(sorted(before))
        cpu_before = cpu_seconds(sorted(before))
        if watch:
            moved = _moved_while_settling(_changes(pid, before))
            if moved is not None:  # it woke before the watch began: it is killed as the watch would
                state.killed = f"{moved}, and the guard killed its {kill_tree(pid, pins, freezer)} processes"
                log.warning("process tree %s ran while stopped: %s", pid, state.killed)
            else:
                watcher = TreeWatch(pid, before, ns_before, pins, freezer)
                watcher.start()
    except BaseException:
        release()
        raise
    try:
        yield state
    finally:
        try:
            if watcher is not None:
                watcher.stop()  # before anything is read: it may be killing
                state.killed, state.watch_error = watcher.killed, watcher.error
            after, state.appeared, state.vanished, state.running = _changes(pid, before)
            state.ran_s = max(0.0, cpu_seconds(after) - cpu_before)
            for p in after:
                was, now = ns_before.get(p), run_ns(p)
                if was is not None and now is not None and woke(was, now):
                    state.woke.append(p)
            if state.escaped() and state.killed is None:
                log.warning("process tree %s ran while stopped: %s", pid, state.escaped())
        finally:
            release()


def _changes(pid: int, before: set[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """The tree now, the processes that appeared in it and went since ``before``, and those
    of it not stopped."""
    now = tree(pid)
    return now, [p for p in now if p not in before], sorted(before.difference(now)), [p for p in now if not _stopped(p)]


def _moved_while_settling(changes: tuple[list[int], list[int], list[int], list[int]]) -> str | None:
    """What the tree did while its run times settled, or None: the watch's first readings are
    taken after the settling, and a process the tree made meanwhile (a helper continued by its
    own timer, which kept the settling going by waking and stopping itself, then forked
    spinners: red team, session 41) was in no reading at all. A stopped tree makes no process,
    loses none, and every process of it is still stopped."""
    _, appeared, vanished, running = changes
    if appeared or vanished:
        return f"processes {appeared} appeared and {vanished} went while it was being stopped"
    if running:
        return f"processes {running} were running again once it had been stopped"
    return None


SETTLE_WAIT_S = 0.003
SETTLE_TRIES = 30


def _settled_run_ns(pids: list[int]) -> dict[int, dict[int, int] | None]:
    """The run time of each of ``pids`` once it has stopped growing. A thread shows state T
    as soon as it takes the stop, a moment before the scheduler switches it out and adds its
    last slice to its run time: read at once, that slice looked like a wake-up inside the
    window and an honest incumbent was accused on a loaded 2-core machine (session 12).
    Readings 3 ms apart until two agree (at most 30); whatever runs after that is in the
    window."""
    now = {p: run_ns(p) for p in pids}
    for _ in range(SETTLE_TRIES):
        time.sleep(SETTLE_WAIT_S)
        again = {p: run_ns(p) for p in pids}
        if again == now:
            break
        now = again
    return now


def _continue(pids: list[int], pins: Pins) -> None:
    for p in reversed(pids):
        pins.signal(p, signal.SIGCONT)
