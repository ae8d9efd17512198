"""Trusted workers on the CPU are forked from a zygote that imported torch once
(``guard.runner.zygote``): they answer as a worker started from a new interpreter does, say
how they ended, fall back to a new interpreter when there is no zygote, and leave nothing
behind when the guard's process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from guard.paths import PROJECT_ROOT
from guard.runner import zygote, zygote_messages
from guard.runner.process import WorkerProcess


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_trusted_workers_are_forks_of_one_zygote_and_say_how_they_ended(tmp_path):
    first = WorkerProcess("trusted", "cpu", tmp_path / "a", 8).start()
    second = WorkerProcess("trusted", "cpu", tmp_path / "b", 8).start()
    try:
        assert isinstance(first.proc, zygote.ForkedWorker) and isinstance(second.proc, zygote.ForkedWorker)
        a, b = first.wait_ready(60), second.wait_ready(60)
        assert a["ready"] and b["ready"] and a["pid"] != b["pid"]
        parents = {_parent(p) for p in (a["pid"], b["pid"])}
        assert len(parents) == 1 and parents != {os.getpid()}  # both children of the one zygote
        # each in its own session: a kill of its group takes nothing else
        assert os.getsid(a["pid"]) == a["pid"] and os.getsid(b["pid"]) == b["pid"]
        # a request answers as in a worker started anew: its peak memory, the imports included
        reply = first.request({"op": "memory"}, 30)
        assert reply["ok"] and reply["peak_bytes"] > 0, reply
    finally:
        first.close()
        second.kill()
    assert first.returncode == 0
    assert second.returncode == -signal.SIGKILL
    assert not _alive(a["pid"]) and not _alive(b["pid"])


def test_a_zygote_that_dies_takes_its_workers_and_the_next_start_gets_a_new_one(tmp_path):
    w = WorkerProcess("trusted", "cpu", tmp_path / "a", 8).start()
    pid = w.wait_ready(60)["pid"]
    old = _parent(pid)
    os.kill(old, signal.SIGKILL)
    try:
        assert w.proc is not None and w.proc.wait(30) == -signal.SIGKILL  # its status died with the zygote
        assert not _alive(pid)
        again = WorkerProcess("trusted", "cpu", tmp_path / "b", 8).start()
        try:
            assert isinstance(again.proc, zygote.ForkedWorker)
            assert _parent(again.wait_ready(60)["pid"]) != old
        finally:
            again.close()
        assert again.returncode == 0
    finally:
        w.kill()


def test_without_a_zygote_a_trusted_worker_starts_from_a_new_interpreter(tmp_path, monkeypatch):
    def refuse(*args):
        raise zygote.ZygoteError("no zygote here")

    monkeypatch.setattr(zygote, "fork_worker", refuse)
    w = WorkerProcess("trusted", "cpu", tmp_path / "t", 8).start()
    try:
        assert isinstance(w.proc, subprocess.Popen)
        assert w.wait_ready(120)["ready"]
    finally:
        w.close(grace=30.0)  # a clean exit is the point here, not its speed on a loaded machine
    assert w.returncode == 0


def test_a_killed_guard_process_leaves_no_zygote_and_no_trusted_worker(tmp_path):
    """The guard's process killed with SIGKILL: its zygote sees its socket close and exits, and
    the trusted worker, whose socket to the guard closed too, kills itself."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from guard.runner.process import WorkerProcess
        w = WorkerProcess("trusted", "cpu", Path({str(tmp_path / "t")!r}), 8).start()
        info = w.wait_ready(120)
        print(info["pid"], w.proc.pid, flush=True)
        time.sleep(600)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    guard = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = guard.stdout.readline() if guard.stdout else ""
        assert line, "the guard process gave no worker pid"
        worker = int(line.split()[0])
        parent = _parent(worker)
        assert parent != guard.pid and _alive(parent)  # the zygote
    finally:
        guard.kill()
        guard.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_alive(worker) or _alive(parent)):
        time.sleep(0.1)
    assert not _alive(worker), "the trusted worker outlived the guard's process"
    assert not _alive(parent), "the zygote outlived the guard's process"


def test_a_gpu_trusted_worker_is_never_forked(tmp_path, monkeypatch):
    """A GPU's trusted worker starts from a new interpreter: the zygote's imports would have
    initialised the driver, and its forks could not use the device. (Here it fails to find a
    GPU once started; only how it was started is looked at.)"""
    asked = []
    monkeypatch.setattr(zygote, "fork_worker", lambda *args: asked.append(args))
    w = WorkerProcess("trusted", "cuda", tmp_path / "g", None).start()
    try:
        assert isinstance(w.proc, subprocess.Popen) and asked == []
    finally:
        w.kill()


def test_a_fork_that_fails_fails_that_worker_and_not_the_zygote(monkeypatch):
    """No process to be had (a candidate that took every pid of the host, red team session 32):
    the zygote answers with an error, closes what it was given, and serves on; the guard's side
    raises for that worker only and keeps the zygote (a fallback start follows)."""
    import errno
    import json
    import socket
    import threading

    from guard.runner import zygote_main

    def no_process():
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(zygote_main.os, "fork", no_process)
    guard_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    served = threading.Thread(target=zygote_main.serve, args=(zygote_end,))
    served.start()
    given_r, given_w = os.pipe()
    try:
        request = {"op": "fork", "argv": [], "cwd": "/", "env": {}}
        socket.send_fds(guard_end, [json.dumps(request).encode()], [given_r, given_w])
        reply = json.loads(guard_end.recv(1 << 16))
        assert reply == {"error": f"fork: {OSError(errno.EAGAIN, 'Resource temporarily unavailable')}"}
    finally:
        os.close(given_r)
        os.close(given_w)
        guard_end.close()  # the zygote's end: it returns
        served.join(10)
    assert not served.is_alive()

    # the guard's side of such an answer
    z = zygote.Zygote.__new__(zygote.Zygote)
    z.broken, z._lock = None, threading.Lock()
    z.sock, answering = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    answering.send(b'{"error": "fork: no process"}')
    try:
        with pytest.raises(zygote.RequestFailed, match="no process"):
            z._ask(zygote_messages.Fork(argv=[], cwd="/", env={}), [], zygote_messages.Forked)
        assert z.broken is None  # still the pool's zygote
    finally:
        z.sock.close()
        answering.close()


def test_requests_out_of_protocol_are_refused_and_the_zygote_serves_on():
    """The zygote validates each request (``zygote_messages``): one that is not JSON, names no
    known op, lacks a field or brings the wrong descriptors is answered ``Failed``, what came
    with it closed, and the next request is served. It serves in a child process of its own,
    whose descriptors alone are counted."""
    import socket

    from guard.runner import zygote_main

    guard_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # the zygote
        guard_end.close()
        os._exit(zygote_main.serve(zygote_end))
    zygote_end.close()
    given_r, given_w = os.pipe()

    def open_in_zygote() -> int:
        return len(os.listdir(f"/proc/{pid}/fd"))

    try:
        guard_end.send(zygote_messages.encode(zygote_messages.Reap(pid=1)))  # it is serving
        guard_end.recv(1 << 16)
        open_before = open_in_zygote()
        bad = [
            (b"not json", [given_r]),
            (b'{"op": "exec", "argv": ["sh"]}', []),
            (b'{"op": "fork", "argv": [], "cwd": "/"}', [given_r, given_w]),  # no env
            (b'{"op": "reap", "pid": "one"}', []),
            (b'{"op": "fork", "argv": [], "cwd": "/", "env": {}}', [given_r]),  # one descriptor of two
        ]
        for data, fds in bad:
            socket.send_fds(guard_end, [data], fds)
            reply = zygote_messages.reply_of(guard_end.recv(1 << 16), zygote_messages.Forked)
            assert isinstance(reply, zygote_messages.Failed), (data, reply)
        assert "descriptors" in reply.error
        assert open_in_zygote() == open_before  # it closed what came with each
        guard_end.send(zygote_messages.encode(zygote_messages.Reap(pid=os.getpid())))
        reaped = zygote_messages.reply_of(guard_end.recv(1 << 16), zygote_messages.Reaped)
        assert reaped == zygote_messages.Reaped(returncode=None)  # no such child, and still serving
    finally:
        os.close(given_r)
        os.close(given_w)
        guard_end.close()  # the zygote's end: it returns
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_an_answer_out_of_turn_ends_the_zygote():
    """The guard validates each reply against what it asked: a reap answered as a fork (or with
    anything else) is no answer, and the zygote that gave it is ended, its workers with it."""
    import socket
    import threading

    z = zygote.Zygote.__new__(zygote.Zygote)
    z.broken, z._lock, z.tasks = None, threading.Lock(), None
    z.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    z.sock, answering = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    answering.send(b'{"pid": 12}')
    try:
        with pytest.raises(zygote.ZygoteError, match="out of turn"):
            z.reap(12)
        assert z.broken is not None and z.proc.poll() is not None
    finally:
        answering.close()
        if z.proc.poll() is None:
            z.proc.kill()
