"""Watching a stopped process tree while it should be still, and killing it the moment it
is not (``runner/freeze.py`` stops it; this module holds it).

A stopped process can be continued by a signal no process of the tree has to send: a POSIX
timer armed before the stop. Seen only after the block, such a tree ran through all of it:
stopped while its guard waited for the timing slot, a candidate continued by its own timers
spun through another guard's timing (red team, session 41). So:

- ``TreeWatch`` reads the tree every ``WATCH_INTERVAL_S`` (a thread's run time of each stopped
  process; every few readings every thread and the tree's processes) and at the first wake-up
  kills the whole tree (``kill_tree``); a woken process can still run until the next reading;
- ``Pins`` holds each process by a pidfd from before it is first signalled, so that no reused
  pid is continued or killed;
- ``sandbox.cgroups.CgroupFreezer``: where the tree has a cgroup v2 group of its own, the
  kernel's freezer holds it too, after the SIGSTOP (a frozen task takes no SIGSTOP until
  thawed); a signal does not thaw it, so a timer's SIGCONT runs none of the tree's code (its
  moment in the kernel shows: the tree is killed all the same).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Literal

from ..sandbox.cgroups import CgroupFreezer
from .proc_tree import stat_fields, tree

log = logging.getLogger(__name__)

# The watch (``TreeWatch``): the time between two readings of the stopped tree (what a woken
# process may run, at most, before it is killed); the share of a core the readings may take at
# most (a tree of many processes is read less often); the readings between two full ones
# (every thread, and the tree's processes); the files read through descriptors held open (the
# others are opened for each reading, several times slower); how long the kill follows new
# processes of the tree. And the tree's processes held by pidfds at most (``Pins``): a tree of
# many must not take the guard's descriptors.
WATCH_INTERVAL_S = 0.003
WATCH_DUTY = 0.05
WATCH_FULL_EVERY = 10
WATCH_HELD_FDS = 128
KILL_FOLLOW_S = 2.0
PINNED_FDS = 256


class Pins:
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


def kill_tree(pid: int, pins: Pins, freezer: CgroupFreezer | None) -> int:
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


@dataclass
class _Watched:
    """One file the watch reads: a thread's ``schedstat``, whose first field is its run time
    (``how`` "prefix"); the children of a thread ("exact"); a process's stat line, for its
    state and CPU ticks, where the kernel keeps no run times ("stat")."""

    what: str
    path: str
    how: Literal["prefix", "exact", "stat"]
    was: bytes | None  # what it held when the watch began
    fd: int | None = None  # held open where there are descriptors to spare

    def changed(self) -> str | None:
        """How the file shows that the tree woke, or None."""
        try:
            now = os.pread(self.fd, 4096, 0) if self.fd is not None else _read(self.path)
        except OSError:
            return f"{self.what} went"
        if self.how == "prefix":
            return f"{self.what} ran" if self.was is None or not now.startswith(self.was) else None
        if self.how == "exact":
            return f"{self.what} changed" if now != self.was else None
        return f"{self.what} ran" if _stat_key(now) != self.was else None


class TreeWatch:
    """A thread that reads the stopped tree while the block lasts and kills it at the first
    sign of a wake-up. Every reading: the run time of one live thread of each process (a
    SIGCONT, the one way a stopped process's own timer wakes it, wakes all its threads). Every
    ``WATCH_FULL_EVERY`` readings: every thread's run time (a thread that made another ran, one
    that exited can no longer be read) and list of children (a process appeared or went)."""

    def __init__(
        self,
        pid: int,
        before: set[int],
        ns_before: dict[int, dict[int, int] | None],
        pins: Pins,
        freezer: CgroupFreezer | None,
    ) -> None:
        self.pid, self.before, self.pins, self.freezer = pid, before, pins, freezer
        self.killed: str | None = None  # what it saw when it killed the tree
        self.error: str | None = None  # the watch itself failed (logged)
        self.t0 = time.monotonic()
        self._halt = threading.Event()
        self._full: list[_Watched] = []
        self._quick: list[_Watched] = []  # one of ``_full`` for each process
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
                watched.fd = os.open(watched.path, os.O_RDONLY | os.O_CLOEXEC)
                held += 1
            except OSError:
                pass  # gone already: the first reading says so
        self._thread = threading.Thread(target=self._run, name=f"freeze-watch-{pid}", daemon=True)

    def _add(self, what: str, path: str, how: Literal["prefix", "exact", "stat"], was: bytes | None) -> _Watched:
        self._full.append(_Watched(what, path, how, was))  # its descriptor opened below, if any
        return self._full[-1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the watch and wait for its thread (and a kill it began) to finish; again, nothing."""
        self._halt.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        for watched in self._full:
            if watched.fd is not None:
                os.close(watched.fd)
                watched.fd = None

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
                n = kill_tree(self.pid, self.pins, self.freezer)
                self.killed = f"{why} {at_ms:.0f} ms into the stop, and the guard killed its {n} processes"
                log.warning("process tree %s ran while stopped: %s", self.pid, self.killed)
        except BaseException as exc:  # noqa: BLE001 - recorded, and the block is still checked after
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("the watch of stopped process tree %s failed", self.pid)


def _changed(files: list[_Watched]) -> str | None:
    """What of ``files`` shows that the tree woke, or None."""
    for watched in files:
        why = watched.changed()
        if why is not None:
            return why
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
