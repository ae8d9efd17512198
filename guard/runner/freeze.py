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

Seen only after the block, such a tree ran through all of it: stopped while its guard waited
for the timing slot, a candidate continued by its own timers spun through another guard's
timing (red team, session 41). So the block is watched while it lasts (``_Watch``): every
``WATCH_INTERVAL_S`` a thread's run time of each stopped process, every few readings every
thread and the tree's processes; the first wake-up SIGKILLs the whole tree (through pidfds
taken at the stop: no reused pid is hit) and ``Freeze.killed`` says so. A woken process can
still run until the next reading. Where the tree has a cgroup v2 group of its own, the kernel's
freezer holds it too, after the SIGSTOP (a frozen task takes no SIGSTOP until thawed): a
signal does not thaw it, so a timer's SIGCONT runs none of the tree's code (its moment in the
kernel shows: the tree is killed all the same).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .proc_tree import run_ns, stat_fields, tree

log = logging.getLogger(__name__)

# a clock tick of CPU time (USER_HZ): what /proc's utime and stime count in
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

# The watch (``_Watch``): the time between two readings of the stopped tree (what a woken
# process may run, at most, before it is killed); the share of a core the readings may take at
# most (a tree of many processes is read less often); the readings between two full ones
# (every thread, and the tree's processes); the files read through descriptors held open (the
# others are opened for each reading, several times slower); how long the kill follows new
# processes of the tree. And the tree's processes held by pidfds at most (``_Pins``): a tree of
# many must not take the guard's descriptors.
WATCH_INTERVAL_S = 0.003
WATCH_DUTY = 0.05
WATCH_FULL_EVERY = 10
WATCH_HELD_FDS = 128
KILL_FOLLOW_S = 2.0
PINNED_FDS = 256
# how long the cgroup freezer may take to report the group frozen (its tasks are stopped already)
FREEZER_WAIT_S = 2.0


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


class _Pins:
    """The processes of the tree, each held by a pidfd from before it is first signalled: a
    process that exits while the block lasts (reaped at once where its parent ignores SIGCHLD)
    leaves its pid free for another, which the SIGCONT and SIGKILL sent through the pidfd never
    reach. Where pidfds are not to be had, or past ``PINNED_FDS`` of them, by pid."""

    def __init__(self) -> None:
        self.fds: dict[int, int | None] = {}
        self.held = 0

    def signal(self, pid: int, sig: int) -> bool:
        """Send ``sig`` to ``pid``, pinned first if it is not yet; False where it is gone (or not
        the guard's to signal)."""
        if pid not in self.fds:
            try:
                self.fds[pid] = os.pidfd_open(pid) if self.held < PINNED_FDS else None
                self.held += self.fds[pid] is not None
            except ProcessLookupError:
                return False
            except OSError:  # no pidfds in this kernel
                self.fds[pid] = None
        fd = self.fds[pid]
        try:
            if fd is None:
                os.kill(pid, sig)
            else:
                signal.pidfd_send_signal(fd, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            if fd is not None:
                os.close(fd)


def _stop_all(pid: int, stopped: list[int], pins: _Pins, timeout_s: float) -> None:
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


class _Freezer:
    """The kernel's freezer of a cgroup v2 group that holds the tree and nothing else:
    ``cgroup.freeze`` written, ``cgroup.events`` read until it says ``frozen 1``."""

    def __init__(self, group: Path) -> None:
        self.group = group
        self.on = False

    @classmethod
    def of(cls, group: Path | None) -> _Freezer | None:
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


def _kill_tree(pid: int, pins: _Pins, freezer: _Freezer | None) -> int:
    """SIGKILL every process of ``pid``'s tree: the group's tasks at once where it has one of
    its own, every process stopped (through its pidfd) and every process the tree shows, read
    again until none is left alive or ``KILL_FOLLOW_S`` is over. Returns the processes signalled."""
    if freezer is not None:
        freezer.kill()
    listed = tree(pid)
    for p in listed:  # pinned before any dies, so that an orphan is still reached once reparented
        pins.signal(p, 0)
    killed = {p for p in list(pins.fds) if pins.signal(p, signal.SIGKILL)}
    deadline = time.monotonic() + KILL_FOLLOW_S
    while time.monotonic() < deadline:
        new = [p for p in tree(pid) if p not in killed and not _dead(p)]
        if not new:
            break
        killed.update(p for p in new if pins.signal(p, signal.SIGKILL))
        time.sleep(0.001)
    return len(killed)


def _dead(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is None or fields[0] in "ZX"


class _Watch:
    """A thread that reads the stopped tree while the block lasts and kills it at the first
    sign of a wake-up. Every reading: the run time of one live thread of each process (a
    SIGCONT, the one way a stopped process's own timer wakes it, wakes all its threads). Every
    ``WATCH_FULL_EVERY`` readings: every thread's run time (a thread that made another ran, one
    that exited can no longer be read) and list of children (a process appeared or went)."""

    def __init__(
        self,
        pid: int,
        state: Freeze,
        before: set[int],
        ns_before: dict[int, dict[int, int] | None],
        pins: _Pins,
        freezer: _Freezer | None,
    ) -> None:
        self.pid, self.state, self.before, self.pins, self.freezer = pid, state, before, pins, freezer
        self.t0 = time.monotonic()
        self._halt = threading.Event()
        # (what it is, a descriptor held open or None, its path, how it is compared, what it
        # held before): schedstat, whose first field is a thread's run time ("prefix"), the
        # children of each thread ("exact"), a process's state and CPU ticks from its stat
        # line where the kernel keeps no run times ("stat")
        self._full: list[list[Any]] = []
        self._quick: list[list[Any]] = []  # one of ``_full`` for each process
        self._first: str | None = None  # seen before the first reading
        self._whole_tree = False  # no children lists in this kernel: the tree is read instead
        for p in sorted(before):
            try:
                tids = sorted(int(t) for t in os.listdir(f"/proc/{p}/task"))
            except (OSError, ValueError):
                tids = []
            threads = ns_before.get(p)
            if threads is None:
                path = f"/proc/{p}/stat"
                try:
                    was = _stat_key(_read(path))
                except OSError:
                    was = None  # gone: the first reading says so
                self._quick.append(self._add(f"process {p}", path, "stat", was))
            else:
                if set(tids) != threads.keys() and self._first is None:
                    self._first = f"the threads of process {p} changed"
                live = [t for t in threads if (stat_fields(p, str(t)) or ["Z"])[0] not in "ZX"]
                for tid, ns in threads.items():
                    path = f"/proc/{p}/task/{tid}/schedstat"
                    watched = self._add(f"thread {tid} of process {p}", path, "prefix", b"%d " % ns)
                    if tid == (live or [tid])[0]:
                        self._quick.append(watched)
            for tid in tids:
                path = f"/proc/{p}/task/{tid}/children"
                try:
                    was = _read(path)
                except FileNotFoundError:
                    self._whole_tree = True
                    continue
                except OSError:
                    was = None
                self._add(f"the children of thread {tid} of process {p}", path, "exact", was)
        held = 0
        quick = {id(w) for w in self._quick}
        for watched in self._quick + [w for w in self._full if id(w) not in quick]:
            if held == WATCH_HELD_FDS:
                break
            try:
                watched[1] = os.open(watched[2], os.O_RDONLY | os.O_CLOEXEC)
                held += 1
            except OSError:
                pass  # gone already: the first reading says so
        self._thread = threading.Thread(target=self._run, name=f"freeze-watch-{pid}", daemon=True)

    def _add(self, what: str, path: str, how: str, was: bytes | None) -> list[Any]:
        self._full.append([what, None, path, how, was])  # the descriptor opened below, if any
        return self._full[-1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the watch and wait for its thread (and a kill it began) to finish."""
        self._halt.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        for _, fd, _, _, _ in self._full:
            if fd is not None:
                os.close(fd)

    def _run(self) -> None:
        try:
            polls = 0
            why = self._first
            while why is None and not self._halt.is_set():
                t = time.thread_time()
                full = polls % WATCH_FULL_EVERY == 0
                why = _changed(self._full if full else self._quick)
                if why is None and full and self._whole_tree:
                    now = set(tree(self.pid))
                    if now != self.before:
                        why = f"processes {sorted(now - self.before)} appeared and {sorted(self.before - now)} went"
                polls += 1
                if why is None:
                    time.sleep(max(WATCH_INTERVAL_S, (time.thread_time() - t) / WATCH_DUTY))
            if why is not None:
                at_ms = (time.monotonic() - self.t0) * 1e3
                n = _kill_tree(self.pid, self.pins, self.freezer)
                self.state.killed = f"{why} {at_ms:.0f} ms into the stop, and the guard killed its {n} processes"
                log.warning("process tree %s ran while stopped: %s", self.pid, self.state.killed)
        except BaseException as exc:  # noqa: BLE001 - recorded, and the block is still checked after
            self.state.watch_error = f"{type(exc).__name__}: {exc}"
            log.exception("the watch of stopped process tree %s failed", self.pid)


def _changed(files: list[list[Any]]) -> str | None:
    """What of ``files`` shows that the tree woke, or None."""
    pread = os.pread
    for what, fd, path, how, was in files:
        try:
            now = pread(fd, 4096, 0) if fd is not None else _read(path)
        except OSError:
            return f"{what} went"
        if how == "prefix":
            if was is None or not now.startswith(was):
                return f"{what} ran"
        elif how == "exact":
            if now != was:
                return f"{what} changed"
        elif _stat_key(now) != was:
            return f"{what} ran"
    return None


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _stat_key(stat: bytes) -> bytes | None:
    """A stopped process's state and CPU ticks, from its stat line (None where unreadable)."""
    fields = stat[stat.rfind(b")") + 2 :].split()
    return b" ".join((fields[0], fields[11], fields[12])) if len(fields) > 12 else None


@contextlib.contextmanager
def frozen(
    pid: int | None, timeout_s: float = 5.0, *, group: Path | None = None, watch: bool = True
) -> Iterator[Freeze]:
    """SIGSTOP ``pid``'s whole tree for the duration of the block (every process seen stopped
    before it starts), SIGCONT after. Raises FreezeError when the tree cannot be stopped; the
    yielded ``Freeze`` says, once the block is over, whether anything ran meanwhile.
    ``group``: a cgroup v2 folder that holds the tree and nothing else, frozen too where it
    has a freezer. ``watch``: kill the tree as soon as it runs (``_Watch``); off for the
    guard's own trusted worker, which nothing condemns."""
    state = Freeze()
    if pid is None:
        yield state
        return
    pins = _Pins()
    freezer = _Freezer.of(group)
    watcher: _Watch | None = None
    try:
        _stop_all(pid, state.pids, pins, timeout_s)
        if freezer is not None:
            state.frozen_by_cgroup = freezer.freeze()
        before = set(tree(pid))
        ns_before = _settled_run_ns(sorted(before))
        cpu_before = cpu_seconds(sorted(before))
        if watch:
            watcher = _Watch(pid, state, before, ns_before, pins, freezer)
            watcher.start()
    except BaseException:
        if watcher is not None:
            watcher.stop()  # joins a thread that started, closes what it opened
        if freezer is not None:
            freezer.thaw()
        _continue(state.pids, pins)
        pins.close()
        raise
    try:
        yield state
    finally:
        try:
            if watcher is not None:
                watcher.stop()  # before anything is read or continued: it may be killing
            after = tree(pid)
            state.ran_s = max(0.0, cpu_seconds(after) - cpu_before)
            state.appeared = [p for p in after if p not in before]
            state.vanished = sorted(before.difference(after))
            state.running = [p for p in after if not _stopped(p)]
            for p in after:
                was, now = ns_before.get(p), run_ns(p)
                if was is not None and now is not None and woke(was, now):
                    state.woke.append(p)
            if state.escaped() and state.killed is None:
                log.warning("process tree %s ran while stopped: %s", pid, state.escaped())
        finally:
            if freezer is not None:
                freezer.thaw()
            _continue(state.pids, pins)
            pins.close()


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


def _continue(pids: list[int], pins: _Pins) -> None:
    for p in reversed(pids):
        pins.signal(p, signal.SIGCONT)
