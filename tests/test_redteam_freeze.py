"""Red team, session 11 (second pass): a stopped tree that runs again by itself and leaves
no trace in what ``guard/runner/freeze.py`` checks after the block.

Two kernel facts that ``frozen`` does not account for:

1. A stopped process is continued by a SIGCONT from *any* sender, and a POSIX timer
   (``timer_create`` with ``SIGEV_SIGNAL`` = SIGCONT, armed before the stop) is such a
   sender: it fires from the kernel while the whole tree shows state T, no process of the
   tree needs to run to send it, and ``_stop_all`` has already returned.
2. A process whose parent ignores SIGCHLD is reaped by the kernel the moment it exits, even
   while that parent is stopped, and its CPU time goes nowhere: not to the parent's
   cutime/cstime (only ``wait`` adds those), and ``cpu_seconds(after)`` no longer lists it.
   ``Freeze.ran_s`` is ``max(0, cpu(after) - cpu(before))`` over the pids still there, and
   ``appeared`` only looks for *new* pids, never for ones that vanished.

So a process woken by its timer spins while the guard "has it stopped" and exits before the
block ends: the sum of the tree's CPU time *drops* by everything that process ever used,
no pid appeared, and ``Freeze.escaped()`` is None. Under the bubblewrap sandbox (its own PID
namespace, as the candidate workers run) it works the same: nothing leaves the tree, the
tree just stops telling.

This test asserts what the guard promises (a tree that ran while stopped is seen); it fails
while the hole is open. It checks what the block sees once it is over, so it runs without the
watch that now kills such a tree inside the block (red team, session 41:
``tests/test_freeze_watch.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from guard.runner.freeze import frozen
from guard.sandbox.bwrap import bwrap_binary
from guard.sandbox.isolation import probe

# The candidate's side, a plain interpreter: a helper that ignores SIGCHLD, with children
# that each arm a SIGCONT timer for ``start`` (CLOCK_MONOTONIC, absolute), sleep until then
# (stopped by the guard meanwhile: the timer continues them), spin until ``end`` in their
# own session (their own autogroup: a fair share each against the guard's worker) and exit.
# Each writes one line (pid, when it started and ended relative to ``start``, CPU it used)
# to ``mark`` before it exits: proof that it ran inside the frozen block.
# Both candidates' sides arm a POSIX timer that sends their process SIGCONT at a given time.
CONTINUE_ME_AT = r"""
import ctypes, os, signal, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
class sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_int * 12)]
class timespec(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
class itimerspec(ctypes.Structure):
    _fields_ = [("interval", timespec), ("value", timespec)]
def continue_me_at(t):
    ev = sigevent(None, signal.SIGCONT, 0)  # SIGEV_SIGNAL
    timer = ctypes.c_void_p()
    assert libc.timer_create(1, ctypes.byref(ev), ctypes.byref(timer)) == 0  # CLOCK_MONOTONIC
    spec = itimerspec(timespec(0, 0), timespec(int(t), int((t % 1) * 1e9)))
    assert libc.timer_settime(timer, 1, ctypes.byref(spec), None) == 0  # TIMER_ABSTIME
"""

ESCAPER = (
    CONTINUE_ME_AT
    + r"""
start, end, n, mark = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children vanish from /proc as they exit
for _ in range(n):
    if os.fork() == 0:
        os.setsid()
        continue_me_at(start)
        while time.monotonic() < start:
            time.sleep(0.001)
        c0, w0 = time.process_time(), time.monotonic()
        while time.monotonic() < end:
            pass
        with open(mark, "a") as f:
            now, cpu = time.monotonic() - start, time.process_time() - c0
            f.write("%d %.3f %.3f %.3f\n" % (os.getpid(), w0 - start, now, cpu))
        os._exit(0)
signal.pause()
"""
)


def in_own_pid_namespace(argv: list[str], shared: Path) -> list[str]:
    """``argv`` in a bubblewrap sandbox with its own PID namespace, as candidate workers run,
    where this machine has one (``shared`` bound read-write); else as it is."""
    if not probe().available:
        return argv
    return [
        str(bwrap_binary()),
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "--bind",
        str(shared),
        str(shared),
        "--",
        *argv,
    ]


def spawn_escaper(start: float, end: float, n: int, mark: Path) -> subprocess.Popen[bytes]:
    """The escaping tree, in a bubblewrap sandbox with its own PID namespace where this
    machine has one (as candidate workers run), else bare. ``mark`` must lie in a folder
    that the sandbox shares (bound read-write at the same path)."""
    # the base interpreter (stdlib only, -S): a virtualenv under /tmp would be hidden by the tmpfs
    python = os.path.realpath(sys.executable)
    argv = in_own_pid_namespace([python, "-S", "-c", ESCAPER, repr(start), repr(end), str(n), str(mark)], mark.parent)
    return subprocess.Popen(argv, start_new_session=True)


def marks(mark: Path) -> list[tuple[int, float, float, float]]:
    if not mark.exists():
        return []
    out = []
    for line in mark.read_text().splitlines():
        pid, t0, t1, cpu = line.split()
        out.append((int(pid), float(t0), float(t1), float(cpu)))
    return out


def spin_for(iterations: int) -> float:
    """A trusted-worker-like loop: wall seconds for a fixed amount of arithmetic."""
    t = time.monotonic()
    x = 0
    for i in range(iterations):
        x += i
    return time.monotonic() - t


def test_a_tree_continued_by_its_own_timer_is_seen_running(tmp_path):
    mark = tmp_path / "marks"
    start = time.monotonic() + 1.0  # after the freeze below has stopped every process
    end = start + 0.5
    proc = spawn_escaper(start, end, 6, mark)
    try:
        time.sleep(0.6)  # the tree is up (6 children sleeping until start)
        with frozen(proc.pid, watch=False) as fz:
            stopped = list(fz.pids)
            while time.monotonic() < start:
                time.sleep(0.002)
            slowed = spin_for(1_500_000)
            while time.monotonic() < end + 0.2:  # every spinner has exited
                time.sleep(0.01)
        alone = spin_for(1_500_000)
        ran = marks(mark)
        # the escape happened: every child spun, inside the block, after all were seen stopped
        assert len(stopped) >= 7, stopped
        assert len(ran) == 6, ran
        assert all(0 <= t0 < t1 <= 0.6 for _, t0, t1, _ in ran), ran
        print(f"guard-like loop: {alone:.3f} s alone, {slowed:.3f} s while 'stopped'; spinners: {ran}")
        print(f"Freeze: ran_s={fz.ran_s:.3f} appeared={fz.appeared} escaped={fz.escaped()!r}")
        # what the guard promises: a tree that ran while stopped is seen
        assert fz.escaped() is not None, (
            f"{len(ran)} processes of the stopped tree ran {sum(c for *_, c in ran):.2f} s of CPU "
            f"inside the frozen block (the guard's loop {slowed / alone:.1f}x slower), unseen"
        )
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


# One process, two threads, stopped by the guard: its own timer continues it, the thread that
# has run longest starts a new thread and exits, and the new one stops the process again.
# The process's pid never changes, nothing appeared or exited among the tree's processes,
# under a tick of CPU time is used, and the sum of its threads' run times *falls* (the old
# thread's long run time leaves with it): each thread has to be followed on its own.
THREAD_SWAP = (
    CONTINUE_ME_AT
    + r"""
start = float(sys.argv[1])
continue_me_at(start)
def successor(predecessor):
    predecessor.join()
    time.sleep(0.05)  # its OS thread gone too
    os.kill(os.getpid(), signal.SIGSTOP)  # looks stopped again when the guard reads it
def old():
    t = time.monotonic()
    while time.monotonic() < t + 0.3:  # a long run time before the stop
        pass
    while time.monotonic() < start:
        time.sleep(0.001)
    threading.Thread(target=successor, args=(threading.current_thread(),)).start()
threading.Thread(target=old).start()
print("ready", flush=True)
threading.Event().wait()
"""
)


def test_a_thread_swapped_while_stopped_is_seen(tmp_path):
    start = time.monotonic() + 1.0
    python = os.path.realpath(sys.executable)
    proc = subprocess.Popen(
        [python, "-S", "-c", THREAD_SWAP, repr(start)], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(0.4)  # the old thread has spun its 0.3 s and sleeps until start
        with frozen(proc.pid, watch=False) as fz:
            before = sorted(os.listdir(f"/proc/{proc.pid}/task"))
            while time.monotonic() < start + 0.3:
                time.sleep(0.01)
            after = sorted(os.listdir(f"/proc/{proc.pid}/task"))
        # the swap happened inside the block, in the one process of the tree
        assert before != after and len(before) == len(after), (before, after)
        assert not fz.appeared and not fz.vanished
        assert fz.escaped() is not None, f"a thread of the stopped process ran and was replaced, unseen: {fz}"
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
