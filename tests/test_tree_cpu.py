"""The CPU time of a worker's tree, read from outside it (``guard.runner.tree_cpu``): what a
CPU window of the outside clock is charged beyond its wall time. Each case runs a fixed amount
of CPU time (not of wall time), so the figures hold on a loaded machine."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from guard.runner import tree_cpu

SPIN_S = 0.2

# A process that, on each command, burns SPIN_S of CPU time: on its main thread ("main"), on a
# thread started and joined for it ("thread"), in a child forked, waited for and reaped ("fork"),
# or in a child left running that the kernel reaps when it is killed ("bank", then "spend the bank").
WORKER = textwrap.dedent(
    f"""
    import os, signal, sys, threading, time

    def spin(clock):
        end = clock() + {SPIN_S}
        while clock() < end:
            pass

    for line in sys.stdin:
        how = line.strip()
        if how == "main":
            spin(time.thread_time)
        elif how == "thread":
            t = threading.Thread(target=spin, args=(time.thread_time,))
            t.start()
            t.join()
        elif how == "fork":
            child = os.fork()
            if child == 0:
                spin(time.process_time)
                os._exit(0)
            os.waitpid(child, 0)
        elif how == "bank":  # a child that has run, to be reaped by the kernel when it ends
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
            bank = os.fork()
            if bank == 0:
                spin(time.process_time)
                signal.pause()
        elif how == "spend the bank":  # the bank ends; a thread runs beside the main thread
            os.kill(bank, signal.SIGKILL)
            t = threading.Thread(target=spin, args=(time.thread_time,))
            t.start()
            t.join()
        elif how == "exec bank":  # a child whose second thread has run 3 spins, then waits
            go_r, go_w = os.pipe()
            ready_r, ready_w = os.pipe()
            exec_bank = os.fork()
            if exec_bank == 0:
                def banked():
                    for _ in range(3):
                        spin(time.thread_time)
                    os.write(ready_w, b"x")
                    os.read(go_r, 1)
                    os.execv("/bin/sleep", ["sleep", "60"])  # takes the leader's thread id
                threading.Thread(target=banked).start()
                signal.pause()
            os.read(ready_r, 1)
        elif how == "spend the exec bank":  # it execs; the main thread and a thread spin side by side
            os.write(go_w, b"x")
            t = threading.Thread(target=spin, args=(time.thread_time,))
            t.start()
            spin(time.thread_time)
            t.join()
            while not os.readlink(f"/proc/{{exec_bank}}/exe").endswith("sleep"):
                time.sleep(0.01)
        print("done", flush=True)
    """
)


@pytest.fixture
def worker():
    proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield proc
    proc.kill()
    proc.wait()


def _window(proc: subprocess.Popen, how: str) -> tuple[tree_cpu.TreeCpu, tree_cpu.TreeCpu]:
    assert proc.stdin is not None and proc.stdout is not None
    before = tree_cpu.read(proc.pid)
    proc.stdin.write(how + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"
    return before, tree_cpu.read(proc.pid)


def test_work_on_the_busiest_thread_is_not_charged_again(worker):
    before, after = _window(worker, "main")
    assert after.total_ns - before.total_ns >= SPIN_S * 1e9  # the tree's CPU time saw it
    assert tree_cpu.parallel_ns(before, after) < 0.05e9  # the wall time holds it already


@pytest.mark.parametrize("how", ["thread", "fork"])
def test_work_beside_the_busiest_thread_is_charged_in_full(worker, how):
    """A thread that came and went, or a child process reaped, inside the window: neither is
    alive at either reading, and all its CPU time is charged on top of the wall time."""
    before, after = _window(worker, how)
    # a reaped child is counted in clock ticks, its user and system times each cut to one
    slack_ns = 2 * tree_cpu._TICK_NS
    assert tree_cpu.parallel_ns(before, after) >= SPIN_S * 1e9 - slack_ns
    assert tree_cpu.charged_s(1.0, before, after) >= 1.0 + SPIN_S - slack_ns / 1e9


def test_a_process_that_ends_unreaped_in_a_window_is_named_and_takes_nothing_away(worker):
    """A red team's bank (session 20): a child that ran before the window and is killed inside
    it, its parent ignoring SIGCHLD, took its whole CPU time out of the tree's total and hid a
    helper thread's work. Each process is counted by its own difference now, and the one that
    went is named (the guard refuses such a window)."""
    _window(worker, "bank")
    before, after = _window(worker, "spend the bank")
    assert len(tree_cpu.vanished(before, after)) == 1
    assert tree_cpu.parallel_ns(before, after) >= SPIN_S * 1e9 * 0.95


def test_a_thread_that_execs_does_not_pass_for_the_busiest(worker):
    """A red team's exec (session 32): a thread other than the leader that calls ``execve``
    takes the leader's thread id, and its own run time with it. A thread that had run three
    spins before the window then looked like the busiest by far, and a spin run beside the
    main thread's came out as nothing beside it."""
    _window(worker, "exec bank")
    before, after = _window(worker, "spend the exec bank")
    assert tree_cpu.vanished(before, after) == []  # the same processes: only a thread went
    assert tree_cpu.parallel_ns(before, after) >= SPIN_S * 1e9 * 0.95


def test_a_gone_process_reads_as_nothing():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert tree_cpu.process_cpu_ns(proc.pid) is None
    assert tree_cpu.read(None) == tree_cpu.TreeCpu()
