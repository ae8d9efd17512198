"""The CPU time a worker's whole process tree has used, read from outside it.

On a CPU the outside clock charges a window its wall time plus the CPU time the tree used
beside its busiest thread: a candidate whose calls ran on a second core while its loop drew
the next inputs (a helper thread, an OpenMP pool, a process forked at import) would otherwise
be charged the longer of the two, where a single-threaded honest kernel is charged their sum.
One thread per CPU worker is a convention (``OMP_NUM_THREADS=1``) the candidate's code can
break; the kernel's accounting of the CPU time it used is out of its reach. Work split over
two cores so costs at least what it would on one: the wall covers the longer part, the
excess the shorter.

Each process is read through its process CPU clock (``clock_gettime`` on the clock that
``clock_getcpuclockid`` names: nanoseconds, its exited threads included, readable by a
process of the same PID namespace or a parent one), what it reaped of its exited children from
``/proc/PID/stat`` (clock ticks: only a process that ends inside a window is counted at that
grain), and each live thread's run time from its ``schedstat``. A process that ends inside a
window without a parent in the tree to reap it (a parent that ignores SIGCHLD) takes its CPU
time out of every count: the window is refused (``vanished``). What a window cannot see: a
process that starts and ends inside it, reaped so (its CPU time is never read; a cgroup's
count, or no process creation in a timed worker, would close it), and the current slice of a
thread running when the window starts (milliseconds at most; an honest worker's threads wait
for the request then).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from .proc_tree import run_ns, stat_fields, tree

_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
_CPUCLOCK_SCHED = 2  # the kernel's clock id of a process's CPU time: ((~pid) << 3) | CPUCLOCK_SCHED


def process_cpu_ns(pid: int, fields: list[str] | None = None) -> int | None:
    """CPU time of the process ``pid`` (all its threads, live or exited), or None when gone.
    ``fields``: its stat fields when the caller has read them (the fallback needs them)."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | _CPUCLOCK_SCHED)
    except OSError:
        fields = fields or stat_fields(pid)  # a kernel without the clock: utime + stime, in ticks
        return None if fields is None or len(fields) < 13 else (int(fields[11]) + int(fields[12])) * _TICK_NS


# a process as one reading names it: its pid and its start time (a pid can be reused)
ProcessKey = tuple[int, int]


@dataclass(frozen=True)
class TreeCpu:
    """One reading of a tree's CPU time: by process (each one's own and what it reaped) and by
    thread, for the threads alive at the reading ((pid, tid) -> ns, from ``schedstat``), with
    when the reading began and ended (monotonic ns)."""

    processes: dict[ProcessKey, int] = field(default_factory=dict)
    threads: dict[tuple[int, int], int] = field(default_factory=dict)
    began_ns: int = 0
    ended_ns: int = 0

    @property
    def total_ns(self) -> int:
        return sum(self.processes.values())


def read(pid: int | None) -> TreeCpu:
    """``pid``'s whole tree now. The processes are read before the threads: what a thread runs
    between the two readings of a window's start is then charged as excess, never hidden."""
    if pid is None:
        return TreeCpu()
    began = time.monotonic_ns()
    pids = tree(pid)
    processes: dict[ProcessKey, int] = {}
    for p in pids:
        fields = stat_fields(p)  # read once: the start time, and what the process reaped (cutime + cstime)
        own = process_cpu_ns(p, fields)
        if fields is not None and len(fields) > 19 and own is not None:
            processes[(p, int(fields[19]))] = own + (int(fields[13]) + int(fields[14])) * _TICK_NS
    threads = {(p, tid): ns for p in pids for tid, ns in (run_ns(p) or {}).items()}
    return TreeCpu(processes, threads, began, time.monotonic_ns())


def vanished(before: TreeCpu, after: TreeCpu) -> list[int]:
    """The processes of the first reading that the second does not find. What such a process
    ran between the two is lost to the accounting (a parent that ignores SIGCHLD has its
    children reaped by the kernel, their CPU time with them), so a window that loses one
    cannot be charged; an honest worker's tree does not change while it is timed."""
    return sorted(pid for pid, start in before.processes.keys() - after.processes.keys())


def parallel_ns(before: TreeCpu, after: TreeCpu, counted_ns: int | None = None) -> int:
    """CPU time the tree used between two readings beyond its busiest thread's: what ran beside
    that thread on other cores (threads that came and went meanwhile, and processes that came,
    counted in full). Each process is counted by its own difference, so one that went
    (``vanished``) takes nothing away from the others. A tree that ran on one core has none
    to speak of.

    The busiest thread is one seen at both readings as the same thread. A thread id is not
    that: a thread other than the leader that calls ``execve`` takes the leader's id, and its
    own run time with it, so a thread that ran before the window looked like the busiest by
    far and the work beside it came out as none (red team, session 32). A process that lost a
    thread between the readings gives no busiest thread, and no thread can have run longer
    than the time between them: what fails either counts as run beside.

    ``counted_ns``: the CPU time the kernel charged the tree's cgroup meanwhile, where it is
    kept; it is used where it is more than the readings found: a child forked and reaped
    between them, unseen by either, that ran half of each call beside the loop was charged
    nothing here otherwise, and the wall then held the other half alone (red team, session
    34, second pass)."""
    used = max(used_ns(before, after), counted_ns or 0)
    lost = {p for p, tid in before.threads if (p, tid) not in after.threads}
    longest = after.ended_ns - before.began_ns
    busiest = max(
        (
            ran
            for key, ns in after.threads.items()
            if key in before.threads and key[0] not in lost
            for ran in (ns - before.threads[key],)
            if ran <= longest
        ),
        default=0,
    )
    return max(0, used - busiest)


def used_ns(before: TreeCpu, after: TreeCpu) -> int:
    """CPU time the tree used between two readings, every thread of every process counted
    (a process that came meanwhile, in full): unlike the wall time, a stall (the process
    runnable but another holding its core) adds nothing to it."""
    return sum(ns - before.processes.get(key, 0) for key, ns in after.processes.items())


def charged_s(wall_s: float, before: TreeCpu, after: TreeCpu) -> float:
    """What a window is charged: its wall time plus what the tree ran beside its busiest thread."""
    return wall_s + parallel_ns(before, after) / 1e9
