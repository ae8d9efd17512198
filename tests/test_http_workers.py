"""`kernelarc serve --transport http --workers N`: the serving process accepts every connection
and passes it to the HTTP worker holding the fewest, so concurrent keep-alive clients are
spread evenly instead of staying with whichever worker accepted first (or wherever a hash of
their port sent them); stopping the server, or killing it, leaves no worker behind."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.procfs import (
    ESTABLISHED,
    LISTEN,
    cpu_seconds,
    descendants,
    process_roles,
    socket_inodes,
    stat_fields,
    tcp_sockets,
)

from helpers import REPO, HttpServer, fast_workspace, free_port, token

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


def alive(procs: dict[int, str]) -> list[int]:
    return [
        pid for pid, start in procs.items() if (f := stat_fields(pid)) is not None and f[19] == start and f[0] != "Z"
    ]


def http_workers(srv: HttpServer, n: int, timeout: float = 60) -> list[int]:
    """The server's HTTP worker processes, once ``n`` of them run (or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [pid for pid, role in process_roles(srv.proc.pid).items() if role == "http worker"]
        if len(pids) >= n or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def send_initialize(conn: http.client.HTTPConnection, tok: str) -> None:
    """The MCP handshake's first request, as an agent with token ``tok`` sends it."""
    conn.request(
        "POST",
        "/mcp",
        json.dumps(INIT),
        {
            "Authorization": f"Bearer {tok}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
    )


def stop(srv: HttpServer, sig: int) -> int:
    srv.proc.send_signal(sig)
    try:
        return srv.proc.wait(timeout=30)
    finally:
        srv.stop()


def gone(procs: dict[int, str], timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="module")
def ws_token(tmp_path_factory):
    ws = fast_workspace(tmp_path_factory.mktemp("http-workers") / "ws")
    return ws, token(ws, "wendy")


# -- tests ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_keep_alive_connections_spread_over_workers_and_stop_cleanly(ws_token, sig):
    ws, tok = ws_token
    workers, clients = 2, 16
    srv = HttpServer(ws, "--workers", str(workers))
    conns = []
    try:
        held = http_workers(srv, workers)
        assert len(held) == workers, held
        # one listening socket, the serving process's: the workers get connections from it
        listening = set(tcp_sockets(srv.port, LISTEN))
        assert len(listening) == 1 and listening <= socket_inodes(srv.proc.pid), listening
        assert not any(socket_inodes(pid) & listening for pid in held)

        # the clients connect at once, then each makes a call and keeps its connection
        conns = [http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120) for _ in range(clients)]
        for c in conns:
            c.connect()
        for c in conns:
            send_initialize(c, tok)
        for c in conns:
            r = c.getresponse()
            assert r.status == 200, r.read()[:300]
            r.read()
        established = set(tcp_sockets(srv.port, ESTABLISHED))
        per_worker = {pid: len(socket_inodes(pid) & established) for pid in held}
        assert sum(per_worker.values()) == clients, per_worker
        # least connections first: 8 and 8 (a hash of the client's port gave 6 of 16 to one of
        # 8 workers; a shared socket gave all 16 to one)
        assert max(per_worker.values()) - min(per_worker.values()) <= 1, per_worker
        assert socket_inodes(srv.proc.pid) & established == set(), "the dispatcher keeps no connection"
        # every worker serves and every connection is idle: the dispatcher waits in select()
        # (it used to spin there, on Unix sockets that are always writable)
        cpu0, t0 = cpu_seconds(srv.proc.pid), time.monotonic()
        time.sleep(2.0)
        idle_cpu = (cpu_seconds(srv.proc.pid) - cpu0) / (time.monotonic() - t0)
        assert idle_cpu < 0.25, f"the serving process used {idle_cpu:.0%} of a core while idle"

        # a worker's closed connections are counted off: the next ones go to it
        first = held[0]
        remote = tcp_sockets(srv.port, ESTABLISHED)
        on_first = {port for inode, port in remote.items() if inode in socket_inodes(first)}
        closing = [c for c in conns if c.sock.getsockname()[1] in on_first][:4]
        # wait until the worker has closed its side of them, then for its reports to travel
        closed_ports = {c.sock.getsockname()[1] for c in closing}
        for c in closing:
            c.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and closed_ports & {
            port for inode, port in tcp_sockets(srv.port, ESTABLISHED).items() if inode in socket_inodes(first)
        }:
            time.sleep(0.1)
        time.sleep(0.5)
        fresh = [http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120) for _ in range(4)]
        conns += fresh
        for c in fresh:
            send_initialize(c, tok)
            r = c.getresponse()
            assert r.status == 200, r.read()[:300]
            r.read()
        remote = tcp_sockets(srv.port, ESTABLISHED)
        fresh_ports = {c.sock.getsockname()[1] for c in fresh}
        assert {port for inode, port in remote.items() if inode in socket_inodes(first)} >= fresh_ports

        procs = descendants(srv.proc.pid)
        assert set(held) <= set(procs)
        # idle keep-alive connections stay open while the server stops
        assert stop(srv, sig) == 0, (ws / f"serve-{srv.port}.log").read_text()[-2000:]
        assert not gone(procs), f"left running after the server stopped: {alive(procs)}"
    finally:
        for c in conns:
            c.close()
        srv.stop()


def test_workers_do_not_outlive_a_killed_server(ws_token):
    ws, _ = ws_token
    srv = HttpServer(ws, "--workers", "2")
    try:
        held = http_workers(srv, 2)
        assert len(held) == 2, held
        procs = descendants(srv.proc.pid)
        srv.proc.kill()
        srv.proc.wait(timeout=10)
        assert not gone(procs, timeout=30), f"left running after the server was killed: {alive(procs)}"
    finally:
        srv.stop()


def test_a_port_in_use_is_refused_even_by_a_reuseport_listener(tmp_path):
    """SO_REUSEPORT lets sockets of one user share a port: a second server must still refuse a
    port another one listens on, not quietly take half its connections, and refuse it before
    it touches the workspace (it would re-queue the running server's evaluation)."""
    from guard.archive.db import Database
    from guard.jobs import SCHEMA as JOBS_SCHEMA

    ws = fast_workspace(tmp_path / "ws")
    db = Database(ws / "workspace.db")
    db.reader().executescript(JOBS_SCHEMA)
    with db.transaction() as c:
        c.execute(
            "INSERT INTO jobs (id, agent, problem, solution_json, state, created_at)"
            " VALUES ('j-running', 'alice', 'rmsnorm_llama3_8b', '{}', 'running', 0)"
        )
    port = free_port()
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", port))
        other.listen()
        out = _serve(ws, port)
    assert out.returncode == 3, out.stderr[-2000:]
    assert "address already in use" in out.stderr.lower(), out.stderr[-2000:]
    assert db.query("SELECT state FROM jobs WHERE id = 'j-running'")[0]["state"] == "running"


@pytest.mark.slow
def test_a_worker_that_crashes_after_serving_is_replaced(ws_token):
    """A worker killed while serving (twice, quickly) is started again after a pause; the
    server keeps answering on its port."""
    ws, tok = ws_token
    srv = HttpServer(ws, "--workers", "2")
    try:
        for _ in range(2):
            held = http_workers(srv, 2)
            assert len(held) == 2, held
            _wait_all_serving(srv.port, tok, set(held))
            time.sleep(0.5)  # the parent learns that a worker serves by polling (every 50 ms)
            os.kill(next(iter(held)), signal.SIGKILL)
            time.sleep(0.3)
        held = http_workers(srv, 2)
        assert len(held) == 2 and srv.proc.poll() is None, (ws / f"serve-{srv.port}.log").read_text()[-2000:]
        _wait_all_serving(srv.port, tok, set(held))  # the replacement answers on its socket too
        assert "starting another" in (ws / f"serve-{srv.port}.log").read_text()
    finally:
        srv.stop()


def _wait_all_serving(port: int, tok: str, pids: set[int], timeout: float = 90) -> None:
    """Until each of ``pids`` has answered a request: new connections land on the workers by
    a hash of their port, and the one that answered is the one holding the connection."""
    served: set[int] = set()
    deadline = time.monotonic() + timeout
    while served < pids:
        assert time.monotonic() < deadline, f"workers {pids - served} never answered"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            send_initialize(conn, tok)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                continue
            mine = conn.sock.getsockname()[1]
            inodes = {i for i, remote in tcp_sockets(port, ESTABLISHED).items() if remote == mine}
            served |= {pid for pid in pids if socket_inodes(pid) & inodes}
        finally:
            conn.close()


def _serve(ws: Path, port: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelarc_mcp.cli",
            "--workspace",
            str(ws),
            "serve",
            "--transport",
            "http",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_one_process_server_stopped_by_sigterm_exits_cleanly(ws_token):
    """uvicorn re-raises SIGTERM after its graceful shutdown; the server still closes its
    service (guard workers included) and exits 0, as a launcher stopping it expects."""
    ws, _ = ws_token
    srv = HttpServer(ws)
    try:
        time.sleep(2)
        procs = descendants(srv.proc.pid)
        assert stop(srv, signal.SIGTERM) == 0, (ws / f"serve-{srv.port}.log").read_text()[-2000:]
        assert not gone(procs), f"left running: {alive(procs)}"
    finally:
        srv.stop()


def test_dispatcher_passes_over_a_full_worker_and_stops_a_broken_one():
    """A worker whose Unix socket is full (it stopped reading) is passed over without being
    dropped; one whose socket is broken is dropped and stopped, so that it is started again."""
    from kernelarc_mcp.serving.workers import Workers

    class FakeProcess:
        terminated = False

        def is_alive(self):
            return True

        def terminate(self):
            self.terminated = True

    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    w = Workers.__new__(Workers)
    w.procs = [FakeProcess() for _ in pairs]
    w.control = [ours for ours, _ in pairs]
    w.held, w.turn, w.serving, w.full = [0, 0, 0], 0, [True] * 3, set()
    for ours, _ in pairs:
        ours.setblocking(False)
    # worker 0 has stopped reading: fill its socket with descriptors until it takes no more
    with socket.socket() as filler:
        while True:
            try:
                socket.send_fds(pairs[0][0], [b"c"], [filler.fileno()])
            except OSError:
                break
    pairs[2][1].close()  # worker 2's end is gone
    w.held = [0, 5, 0]  # so the full worker 0 and the broken worker 2 are tried first
    try:
        with socket.socket() as conn:
            took = w._hand_over(conn, [0, 1, 2])
        assert took == 1, took
        assert w.control[0] is not None and not w.procs[0].terminated  # full: passed over, kept
        assert w.full == {0}  # watched until its socket is writable, offered no connection till then
        assert w.control[2] is None and w.procs[2].terminated  # broken: dropped and stopped
        assert w.held == [0, 6, 0]
        data, fds, _, _ = socket.recv_fds(pairs[1][1], 16, 4)
        assert data == b"c" and len(fds) == 1
        os.close(fds[0])
    finally:
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
