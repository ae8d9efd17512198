"""Candidate workers on the CPU are forked by their pool's zygote inside the OS sandbox, each
into a cell of its own (``guard.runner.cells``, ``guard.sandbox.cell``): what a worker sees
from its cell, that a kill leaves nothing behind, and that without the zygote workers start as
before. Real bwrap processes on the CPU."""

from __future__ import annotations

import json
import os
import platform
import resource
import signal
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from guard.runner import cells, zygote
from guard.runner.pool import WorkerPool
from guard.runner.process import WorkerDied

from helpers import SYSCALLS, WRITABLE_SCAN, fake_workspace, host_pids_with, orphan_source, prepare_candidate

pytestmark = pytest.mark.timeout(120)

# Run when the candidate's module is imported (its worker's ``prepare``): what it can see and
# do from its cell, written to its own folder.
PROBE = """
import ctypes, json, os, socket
def attempt(fn):
    try:
        r = fn()
        return r if isinstance(r, (list, str)) else "ok"
    except OSError as e:
        return "denied: " + type(e).__name__
def connect():
    with socket.create_connection(("127.0.0.1", {port}), timeout=2):
        return "connected"
libc = ctypes.CDLL(None, use_errno=True)
def syscall(nr, *args):
    if libc.syscall(nr, *args) < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
def umount(path):
    if libc.umount2(path.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), "umount")
seen = {{
    "pid": os.getpid(),
    "procs": sorted(p for p in os.listdir("/proc") if p.isdigit()),
    "caps": [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("Cap")],
    "pool": attempt(lambda: os.listdir({root!r})),
    "other": attempt(lambda: os.listdir({other!r})),
    "other_write": attempt(lambda: open({other!r} + "/planted", "w").write("x")),
    "ws": attempt(lambda: os.listdir({ws!r})),
    "secret": attempt(lambda: open({ws!r} + "/secret.key").read()),
    "problem": attempt(lambda: open({ws!r} + "/problems/p/definition.json").read()),
    "problem_write": attempt(lambda: open({ws!r} + "/problems/p/planted", "w").write("x")),
    "umount_pool": attempt(lambda: umount({root!r})),
    "tcp": attempt(connect),
    "own": attempt(lambda: open("own.txt", "w").write("mine")),
    "writable": writable_outside([os.getcwd(), "/tmp", "/dev/shm"]),
    "pts": os.listdir("/dev/pts"),
    "add_key": attempt(lambda: syscall({add_key}, b"user", b"k", b"v", 1, ctypes.c_long(-3))),
    "own_userns": attempt(lambda: syscall({unshare}, 0x10000000)),
}}
open("probe.json", "w").write(json.dumps(seen))
import torch
def run(x, w):
    return x
"""


@pytest.fixture
def pool(tmp_path, needs_bwrap):
    ws = fake_workspace(tmp_path)
    # the workspace under /tmp, as tests' are, with a problem folder shown: the cell's own /tmp
    # must show it as the sandbox did, read-only
    p = WorkerPool("cpu", tmp_path / "workers", prestart=False, protect=[ws], expose=[ws / "problems"])
    yield p
    p.close()


def test_candidate_workers_are_forked_into_cells_of_their_own(tmp_path, pool):
    first, second = pool.take_candidate(), pool.take_candidate()
    try:
        for w in (first, second):
            assert isinstance(w.proc, zygote.ForkedWorker) and w._sandbox_init is not None
            assert w.wait_ready(60)["pid"] == 1  # PID 1 of its own PID namespace
            # what it names by pid is looked for from there, never from the child above it
            nspid = [
                ln for ln in Path(f"/proc/{w.sandbox_pid}/status").read_text().splitlines() if ln.startswith("NSpid")
            ]
            assert nspid[0].split()[-1] == "1" and w.sandbox_pid != w.proc.pid, nspid
        # the other worker holds a terminal open: this one's /dev/pts must not list it
        holder = "import os\n_pty = os.open('/dev/ptmx', os.O_RDWR)\nimport torch\ndef run(x, w):\n    return x\n"
        assert prepare_candidate(second, holder, tmp_path / "cache").get("ok")
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            listener.settimeout(0.5)
            numbers = SYSCALLS[platform.machine()]
            source = WRITABLE_SCAN + PROBE.format(
                add_key=numbers[0],
                unshare=numbers[1],
                port=listener.getsockname()[1],
                root=str(pool.root),
                other=str(second.workdir),
                ws=str(tmp_path / "ws"),
            )
            reply = prepare_candidate(first, source, tmp_path / "cache")
            assert reply.get("ok"), reply
            with pytest.raises(socket.timeout):
                listener.accept()
        seen = json.loads((first.workdir / "probe.json").read_text())
        assert seen["procs"] == ["1"], seen  # neither the zygote nor the other worker
        assert all(int(c, 16) == 0 for c in seen["caps"]), seen
        assert seen["pool"] == [first.workdir.name], seen  # only its own folder in the pool's
        assert seen["other"].startswith("denied") and seen["other_write"].startswith("denied"), seen
        assert not (second.workdir / "planted").exists()
        assert seen["ws"] == ["problems"] and seen["secret"].startswith("denied"), seen
        assert seen["problem"] == "{}" and seen["problem_write"].startswith("denied"), seen
        assert seen["umount_pool"].startswith("denied") and seen["tcp"].startswith("denied"), seen
        assert seen["writable"] == [], seen
        assert seen["pts"] == ["ptmx"], seen  # its own pseudo-terminals only
        # keyrings are the uid's, shared by every cell; a user namespace would give capabilities back
        assert seen["add_key"].startswith("denied") and seen["own_userns"].startswith("denied"), seen
        assert seen["own"] == "ok" and (first.workdir / "own.txt").read_text() == "mine"
    finally:
        pool.discard(first)
        pool.discard(second)


def test_a_killed_cell_leaves_nothing_and_the_zygote_forks_the_next(tmp_path, pool):
    marker = f"{time.time_ns() % 10**9}.25"  # sleep's argument: unique on this machine
    source = orphan_source(marker)
    worker = pool.take_candidate()
    try:
        prepare_candidate(worker, source, tmp_path / "cache")
        deadline = time.monotonic() + 10
        while not host_pids_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pids_with(marker), "the candidate's grandchild did not start"
    finally:
        pool.discard(worker)
    assert host_pids_with(marker) == []
    assert worker.proc is not None and worker.proc.poll() == -9
    again = pool.take_candidate()
    try:
        assert isinstance(again.proc, zygote.ForkedWorker) and again.wait_ready(60)["pid"] == 1
    finally:
        pool.discard(again)


def test_without_the_zygote_candidate_workers_start_as_before(tmp_path, needs_bwrap, monkeypatch):
    def refuse(*args, **kwargs):
        raise zygote.ZygoteError("no zygote here")

    monkeypatch.setattr(cells, "start", refuse)
    p = WorkerPool("cpu", tmp_path / "workers", prestart=False)
    try:
        w = p.take_candidate()
        assert isinstance(w.proc, subprocess.Popen) and w.isolation == "bubblewrap"
        assert w.wait_ready(60)["ready"]
        p.discard(w)
        assert p._cells_failed == "no zygote here"  # not tried again for every worker
    finally:
        p.close()


def test_a_zygote_that_cannot_make_a_cell_does_not_start(tmp_path, needs_bwrap):
    """It enters a cell once before it says ready: where a cell cannot be made (here: without
    the capabilities to mount), the pool learns it at the start, not from a candidate's
    failed verdict, and starts its workers from new interpreters."""
    from guard.runner.worker_environment import worker_env

    with pytest.raises(zygote.ZygoteError, match="a cell could not be made here"):
        cells.start(tmp_path / "workers", "cpu", worker_env("cpu"), [], [], caps=())
    assert [p.name for p in (tmp_path / "workers").iterdir()] == [cells.LOG_NAME]  # no probe folder left


def test_a_killed_guard_process_leaves_no_cell(tmp_path, needs_bwrap):
    """The guard's process killed with SIGKILL: bwrap's --die-with-parent ends the zygote's
    sandbox, and the kernel every process of its PID namespaces, cells included."""
    marker = f"{time.time_ns() % 10**9}.75"
    code = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
        from pathlib import Path
        from guard.runner.pool import WorkerPool
        from helpers import prepare_candidate
        pool = WorkerPool("cpu", Path({str(tmp_path / "workers")!r}), prestart=False)
        w = pool.take_candidate()
        src = "import subprocess\\nsubprocess.Popen(['sleep', '{marker}'])\\n"
        src += "import torch\\ndef run(x, w):\\n    return x\\n"
        prepare_candidate(w, src, Path({str(tmp_path / "cache")!r}))
        print("ready", flush=True)
        time.sleep(600)
    """)
    guard = subprocess.Popen([os.sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert guard.stdout is not None and guard.stdout.readline().strip() == "ready"
        assert host_pids_with(marker), "the candidate's child did not start"
    finally:
        guard.kill()
        guard.wait()
    deadline = time.monotonic() + 10
    while host_pids_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host_pids_with(marker) == []


def test_a_crashing_candidate_leaves_no_core_file_and_says_its_signal(tmp_path, pool):
    """A worker that dies of SIGSEGV: its status says the signal, and neither it nor the child
    between it and the zygote (a copy of the zygote's memory, about 170 MB) writes a core
    file, whatever core limit the guard runs with (red team, session 32)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    try:
        worker = pool.take_candidate()
        with pytest.raises(WorkerDied):
            prepare_candidate(worker, "import ctypes\nctypes.string_at(0)\n", tmp_path / "cache")
        assert worker.proc is not None and worker.proc.wait(10) == -signal.SIGSEGV
        pool.discard(worker)
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))
    assert not [p for p in tmp_path.rglob("core*")], list(tmp_path.rglob("core*"))
