"""Work hidden behind the guard's own shortens no CPU window.

In a CPU's outside-clock window the guard, after each call's DONE, reads the chosen calls'
outputs and writes the next inputs (``guard/cascade/paced_calls.py``). A loop that says each
call done before computing it (``tests/cheats/says_each_call_done_then_races_the_read.py``)
computes while the guard does that work, on another core, and is named where the guard's read
comes first. On a loaded machine it can come after: the fresh-clone suite at bf3227b PASSED
that cheat once. Its window's wall is then shorter than the CPU time the two sides took, and
the window was charged the lesser of the two. It is now charged the CPU time where the
sandbox counts it.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from guard.cascade import cpu_windows
from guard.runner import tree_cpu

LOOP_THREAD = (41, 41)  # (pid, tid) of the candidate's loop
WALL_S, LOOP_S, GUARD_S = 0.010, 0.009, 0.006  # the window's wall, the loop's CPU, the guard's


def _busy(seconds: float) -> None:
    """CPU time of this thread, as the guard's reads and writes take it."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _charged_window(monkeypatch, cpu_ns) -> tuple[cpu_windows.CpuWindows, float]:
    """A window of ``WALL_S`` in which the loop thread computed ``LOOP_S`` while the guard's
    thread worked ``GUARD_S`` beside it; ``cpu_ns``: the sandbox's count as the worker reads it.
    (the windows, what the window was charged)."""
    before = tree_cpu.TreeCpu({(41, 1): 0}, {LOOP_THREAD: 0}, 0, 0)
    after = tree_cpu.TreeCpu({(41, 1): int(LOOP_S * 1e9)}, {LOOP_THREAD: int(LOOP_S * 1e9)}, 0, int(WALL_S * 1e9))
    monkeypatch.setattr(cpu_windows.tree_cpu, "read", lambda pid: after)
    worker = SimpleNamespace(cpu_ns=cpu_ns)
    windows = object.__new__(cpu_windows.CpuWindows)
    windows.cx = SimpleNamespace(worker=worker, w=SimpleNamespace(uuid="w"))
    windows.run_pid = 41
    windows.by_cpu_time = False

    counted0 = worker.cpu_ns()
    mine0 = time.thread_time()
    _busy(GUARD_S)  # the guard's reads and writes, while the loop computed
    t0 = time.monotonic() - WALL_S  # the window's wall: the two sides side by side
    charge, parallel = windows.charge(cpu_windows.Ran(WALL_S, t0, counted0, mine0, before, [], []))
    assert parallel == 0  # one thread of the candidate's ran: nothing beside it
    return windows, charge


def test_a_window_is_charged_the_cpu_time_of_both_sides(monkeypatch):
    """The loop thread computed 9 ms of a 10 ms window while the guard's thread worked 6 ms
    beside it: a window of 15 ms of work, not 10."""
    counts = iter([0, int(LOOP_S * 1e9)])  # the sandbox's cgroup: at the start, at the charge
    windows, charge = _charged_window(monkeypatch, lambda: next(counts))
    assert charge >= LOOP_S + GUARD_S, charge
    # the trusted window is charged its CPU time alike, where the candidate's was
    assert windows.trusted_charge(0.004, 0.005) == 0.005


def test_without_a_cgroup_count_the_window_is_never_charged_less_than_its_readings(monkeypatch):
    windows, charge = _charged_window(monkeypatch, lambda: None)
    assert charge >= LOOP_S + GUARD_S, charge
    assert windows.trusted_charge(0.004, 0.005) == 0.004  # the lesser, as the wall charges the candidate
