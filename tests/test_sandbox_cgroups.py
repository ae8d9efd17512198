"""A sandbox's cgroups (``guard.sandbox.cgroups``): its processes and threads capped, its CPU
time counted. A candidate that forks without end stops at its cap, the guard judges the next
candidate as before, and no group is left behind (run by root, uid 0 is not held to
RLIMIT_NPROC: a candidate took every pid of the host before this, red team, session 32). A
process that starts and ends unseen is still counted.

The tests that make groups need cgroups this process may write (cgroup v1's pids and cpuacct
hierarchies, or a v2 subtree with the pids controller delegated); elsewhere they skip, and
the isolation line says "tasks not capped" (``test_sandbox.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from guard.candidates.load import from_source
from guard.sandbox import cgroups

from helpers import RMS, honest_source, make_guard, unique

FORKS = textwrap.dedent(
    """
    import os, time
    made = 0
    try:
        while made < LIMIT:
            if os.fork() == 0:
                os.closerange(0, 3)  # the caller waits for its output's end, not for these
                time.sleep(600)
                os._exit(0)
            made += 1
    except OSError as exc:
        print("stopped", exc.errno)
    print("made", made)
    """
)


@pytest.fixture
def capped():
    found = cgroups.probe()
    if not found.available:
        pytest.skip(f"no pids cgroup here: {found.reason}")
    return found


def _mine(base) -> set[str]:
    """This process's groups: other guards of the test session (fixtures) hold theirs too."""
    return {p.name for p in base.iterdir() if p.name.startswith(f"{cgroups.PREFIX}{os.getpid()}-")}


# -- finding the hierarchy --------------------------------------------------------------------
def _fake_proc(tmp_path, cgroup: str, mountinfo: str):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo.replace("MNT", str(tmp_path / "mnt")))
    return proc


def test_the_pids_hierarchy_is_found_in_v1_and_v2(tmp_path):
    (tmp_path / "mnt" / "guard" / "job").mkdir(parents=True)
    v1 = _fake_proc(
        tmp_path,
        "9:memory:/guard/job\n8:pids:/guard/job\n0::/\n",
        "30 25 0:27 / MNT rw,relatime - cgroup cgroup rw,memory\n"
        "31 25 0:28 / MNT rw,relatime - cgroup cgroup rw,pids\n",
    )
    assert cgroups.own_cgroup("pids", v1) == tmp_path / "mnt" / "guard" / "job"
    (tmp_path / "proc").rename(tmp_path / "proc-v1")
    v2 = _fake_proc(tmp_path, "0::/guard/job\n", "40 25 0:29 / MNT rw,nosuid - cgroup2 cgroup2 rw\n")
    assert cgroups.own_cgroup("pids", v2) == tmp_path / "mnt" / "guard" / "job"


def test_no_hierarchy_is_a_reason_not_a_path(tmp_path):
    proc = _fake_proc(tmp_path, "0::/\n", "22 1 8:1 / / rw - ext4 /dev/vda rw\n")
    found = cgroups.own_cgroup("pids", proc)
    assert isinstance(found, str) and "no pids cgroup" in found, found


# -- the cap ----------------------------------------------------------------------------------
def test_a_group_stops_a_fork_loop_at_its_cap_and_is_removed(capped):
    group = cgroups.SandboxGroup.make(16, "test")
    assert group is not None
    try:
        done = subprocess.run(
            group.enter([sys.executable, "-c", FORKS.replace("LIMIT", "200")]),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            timeout=60,
            start_new_session=True,
        )
        made = int(done.stdout.split("made")[-1].split()[0])
        assert "stopped 11" in done.stdout and made < 16  # EAGAIN at the cap, the shell counted
        assert len(group.tasks()) == made  # its sleeping children are still in it
    finally:
        assert group.close()
    assert not group.path.exists()


def test_the_groups_of_a_guard_that_is_gone_are_swept(capped):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = capped.base / f"{cgroups.PREFIX}{gone.pid}-worker-0-abcdef"
    stale.mkdir()
    group = cgroups.SandboxGroup.make(16, "test")
    assert group is not None and group.close()
    assert not stale.exists()


def test_a_candidate_that_forks_without_end_stops_at_its_cap(session_tmp, capped):
    limit = 48
    bomb = "import os, time\n\n\ndef run(*args):\n" + textwrap.indent(
        FORKS.replace("LIMIT", "100000").replace('print("made", made)', 'raise RuntimeError(f"made {made}")'), "    "
    )
    before = _mine(capped.base)
    g = make_guard(session_tmp / "ws-tasks", static_screen=False, call_timeout_s=20, sandbox_tasks_limit=limit)
    try:
        v = g.evaluate(from_source(unique(bomb), None, "kernel.py"), RMS, agent="bomb")
        assert v.decision == "REJECT" and v.status == "RUNTIME_ERROR", v.reason
        assert "RuntimeError: made" in (v.reason or ""), v.reason  # the exception, not its line
        made = int((v.reason or "").split("made ")[1].split()[0])
        assert 0 < made < limit, v.reason  # a group of its own, a cell's or its sandbox's
        honest = g.evaluate(from_source(unique(honest_source()), None, "kernel.py"), RMS, agent="after")
        assert honest.status == "PASSED", honest.reason
    finally:
        g.close()
    assert _mine(capped.base) <= before  # every group of this guard removed with its sandbox


def test_each_cell_has_a_group_of_its_own(session_tmp, capped):
    """Cells of one zygote that shared a group could pass messages through its count (one
    fills it, the other's fork fails) while both live: a challenger and its incumbent."""
    from guard.runner.pool import WorkerPool

    before = _mine(capped.base)
    pool = WorkerPool("cpu", session_tmp / "cells-groups", prestart=False, tasks_limit=64)
    try:
        workers = [pool.take_candidate() for _ in range(2)]
        for w in workers:
            w.wait_ready()
        groups = [_pids_cgroup(w.sandbox_pid) for w in workers]
        assert all(cgroups.PREFIX in g for g in groups), groups
        if pool._cells is not None:  # forked into cells: each moved out of the zygote's group
            assert "-cell-" in groups[0] and "-cell-" in groups[1] and groups[0] != groups[1], groups
        for w in workers:
            pool.discard(w)
    finally:
        pool.close()
    assert _mine(capped.base) <= before


def _pids_cgroup(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if "pids" in controllers.split(",") or (number == "0" and not controllers):
                return path
    return ""


def test_a_process_started_and_reaped_unseen_is_counted(capped):
    """The tree's own reading misses a child that the kernel reaps (SIGCHLD ignored): its CPU
    time reaches no parent. The group's count does not."""
    if capped.cpu_base is None:
        pytest.skip(f"no CPU time counted here: {capped.cpu_reason}")
    group = cgroups.SandboxGroup.make(16, "test")
    assert group is not None and group.cpu_ns() is not None
    spin = "import os, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n" + (
        "pid = os.fork()\nif pid == 0:\n    t = time.process_time()\n    while time.process_time() - t < 0.3: pass\n"
        "    os._exit(0)\ntry:\n    os.waitpid(pid, 0)\nexcept ChildProcessError:\n    pass\n"
    )
    try:
        before = group.cpu_ns()
        subprocess.run(group.enter([sys.executable, "-c", spin]), timeout=60, check=True)
        used = group.cpu_ns() - before
        assert used >= 0.3e9, used  # the child's 0.3 s, though nothing reaped it
    finally:
        assert group.close()


HOARDER = """
import subprocess, sys, time

HOLD = (
    "import time\\nb = bytearray(900 << 20)\\nb[::4096] = b'x' * len(b[::4096])\\n"
    "print('held', flush=True)\\ntime.sleep(60)\\n"
)


def run(*args):
    children = [
        subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True) for _ in range(4)
    ]
    said = [child.stdout.readline().strip() == "held" for child in children]
    time.sleep(1)  # a child killed for the last one's memory may have said it first
    held = sum(ok and child.poll() is None for ok, child in zip(said, children))
    for child in children:
        child.kill()
    raise RuntimeError(f"held {held} of 4")
"""


def test_a_candidates_processes_stay_within_its_memory_cap_together(session_tmp, capped):
    """Each process is held to ``cpu_memory_limit_gb`` by RLIMIT_AS; the sandbox's processes
    together are held to it by the memory group: four children of 900 MB each under a cap of
    3.25 GB cannot all hold theirs (the kernel kills in the group, never elsewhere). (The cap
    is the smallest a guard takes: it keeps 3 GiB of it for its own work.)"""
    if capped.memory_base is None:
        pytest.skip("no memory cgroup can be made here")
    g = make_guard(session_tmp / "ws-memory-cap", static_screen=False, call_timeout_s=60, cpu_memory_limit_gb=3.25)
    try:
        v = g.evaluate(from_source(unique(HOARDER), None, "kernel.py"), RMS, agent="hoarder")
    finally:
        g.close()
    assert v.decision == "REJECT" and v.status == "RUNTIME_ERROR", v.reason
    if "held" in (v.reason or ""):  # a child was killed: the worker told how many held
        held = int(v.reason.split("held ")[1].split()[0])
        assert held <= 3, v.reason  # four of 900 MB do not fit in 3.25 GB
    else:  # the worker itself was the one killed
        assert "memory cap" in (v.reason or ""), v.reason


def test_a_memory_cap_holds_for_swap_too(capped):
    """A group at its memory cap must not go on in swap (slowing the host's timed workers):
    where the kernel counts swap, its limit is set with the memory's."""
    if capped.memory_base is None:
        pytest.skip("no memory cgroup can be made here")
    group = cgroups.SandboxGroup.make(64, "swap-test", 1 << 30)
    assert group is not None and group.memory_path is not None
    try:
        v2, v1 = group.memory_path / "memory.swap.max", group.memory_path / "memory.memsw.limit_in_bytes"
        if not v2.exists() and not v1.exists():
            pytest.skip("this kernel does not count swap in its memory groups")
        if v2.exists():
            assert v2.read_text().strip() == "0"
        else:
            assert int(v1.read_text()) == 1 << 30
    finally:
        group.close()
