"""A worker's exchanges (``guard.runner.process.WorkerProcess``): one cut short from outside
the protocol leaves no reply to answer the next request."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from guard.runner import process as process_mod
from guard.runner import protocol
from guard.runner.process import WorkerProcess


class Interrupted(BaseException):
    """What a signal handler or a caller's own timeout raises in the middle of a wait."""


@pytest.fixture
def worker(tmp_path):
    """A trusted worker object over a socket pair, its process a stand-in that never answers;
    the test speaks for the worker through the other end."""
    w = WorkerProcess("trusted", "cpu", tmp_path / "w")
    w.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    w.sock, peer = socket.socketpair()
    w.info = {"ready": True}
    w.wait_ready = lambda timeout=0: None  # started already
    yield w, peer
    w.kill()
    peer.close()


def test_a_wait_cut_short_from_outside_kills_the_worker(worker, monkeypatch):
    w, peer = worker
    w.send({"op": "build"})

    def cut(sock, timeout):
        raise Interrupted()

    monkeypatch.setattr(process_mod.protocol, "recv", cut)
    with pytest.raises(Interrupted):
        w.receive(5)
    # the build's reply, still on its way, must never answer the next request: the worker
    # is gone, and the pool starts another for it
    assert not w.alive


def test_the_protocol_s_own_failures_keep_their_meaning(worker):
    w, peer = worker
    w.send({"op": "problem"})
    protocol.send(peer, {"ok": True, "key": "k"})
    assert w.receive(5) == {"ok": True, "key": "k"}
    assert w.alive  # an answered exchange leaves the worker in step
    w.send({"op": "memory"})
    with pytest.raises(process_mod.WorkerTimeout):
        w.receive(0.2)
    assert not w.alive  # killed by the timeout itself, as before


def test_a_request_sent_while_one_is_unanswered_ends_the_worker(worker):
    """An interruption between a send and its wait leaves a request unanswered: its reply would
    answer the next one, so that next send ends the worker (a review of ours, session 49)."""
    w, peer = worker
    w.send({"op": "build"})
    with pytest.raises(RuntimeError, match="sent before 'build' was answered"):
        w.send({"op": "problem"})
    assert not w.alive


def test_a_request_too_large_to_send_leaves_the_worker_in_step(worker, monkeypatch):
    w, peer = worker
    monkeypatch.setattr(protocol, "MAX_MESSAGE", 64)
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        w.send({"op": "problem", "definition": "x" * 100})
    assert w.alive
    monkeypatch.setattr(protocol, "MAX_MESSAGE", 1 << 20)
    w.send({"op": "memory"})  # nothing was outstanding: the next request goes out
    protocol.send(peer, {"ok": True})
    assert w.receive(5) == {"ok": True}


@pytest.mark.parametrize("raised", [TimeoutError, InterruptedError])
def test_a_caller_s_timeout_in_a_wait_is_not_the_worker_s_death(worker, monkeypatch, raised):
    """TimeoutError and InterruptedError are OSErrors, which the protocol reads as a dead peer:
    a caller's own timer raising one mid-wait was reported as the worker's death."""
    w, peer = worker
    w.send({"op": "build"})

    def cut(sock, timeout):
        raise raised("the caller's timer")

    monkeypatch.setattr(process_mod.protocol, "recv", cut)
    with pytest.raises(raised, match="the caller's timer"):
        w.receive(5)
    assert not w.alive  # out of step all the same


def test_a_caller_s_timeout_in_a_send_is_not_the_worker_s_death(worker, monkeypatch):
    w, peer = worker

    def cut(sock, message):
        raise TimeoutError("the caller's timer")

    monkeypatch.setattr(process_mod.protocol, "send", cut)
    with pytest.raises(TimeoutError, match="the caller's timer"):
        w.send({"op": "build"})
    assert not w.alive


def test_a_worker_not_yet_leading_its_group_is_killed(tmp_path, caplog):
    """A worker is killed by its process group; one forked a moment ago leads none yet (its
    setsid not yet run: a guard closed during its warm-up). Nothing killed it, and its kill
    waited 10 s for it ("did not die after SIGKILL"), holding a server's stop (session 50)."""
    w = WorkerProcess("candidate", "cpu", tmp_path / "w")
    w.proc = subprocess.Popen(["sleep", "60"])  # in the test's own process group
    assert os.getpgid(w.proc.pid) != w.proc.pid
    with caplog.at_level("WARNING", logger="guard.runner.process"):
        w.kill()
    assert w.proc.poll() is not None
    assert "did not die" not in caplog.text
