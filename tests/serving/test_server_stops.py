"""A server that stops leaves none of its jobs waiting: on a clean stop (stdin closed, SIGTERM,
SIGINT) the job it judges becomes interrupted and its queued ones cancelled, each saying the
server stopped; a server that was killed cannot say so, and the next one does it for it.

The job being judged is an endless candidate (with a call timeout far beyond the test): the
test stops the server while it runs, never waits for a verdict, so it does not depend on how
fast the machine is."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import time
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from guard.archive.servers import alive, process_identity
from guard.jobs import JobQueue
from kernelarc_mcp.server import build_server

from helpers import (
    CHEATS,
    RMS,
    HttpServer,
    StdioServer,
    fast_workspace,
    honest_source,
    make_guard,
    make_service,
    unique,
)

ENDLESS = CHEATS / "infinite_loop.py"


def rows(ws: Path, sql: str, params: tuple = ()) -> list[dict]:
    """Read the workspace database as it is (the Database class would mark orphans on open)."""
    conn = sqlite3.connect(ws / "workspace.db", timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


def job(ws: Path, job_id: str) -> dict:
    return rows(ws, "SELECT * FROM jobs WHERE id = ?", (job_id,))[0]


def until(what, timeout: float = 60, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"not within {timeout} s")


def submit_two(srv: StdioServer, ws: Path) -> tuple[str, str]:
    """An endless candidate, being judged once this returns, and an honest one queued behind it."""
    running = srv.call_tool("submit_candidate", {"problem": RMS, "source": unique(ENDLESS.read_text()), "wait_s": 0})
    queued = srv.call_tool("submit_candidate", {"problem": RMS, "source": honest_source(), "wait_s": 0})
    # the job is claimed at once; its candidate is recorded once the static screen has passed
    until(
        lambda: (
            job(ws, running["job_id"])["state"] == "running"
            and rows(ws, "SELECT 1 FROM candidates WHERE state = 'running'")
        )
    )
    assert job(ws, queued["job_id"])["state"] == "queued"
    return running["job_id"], queued["job_id"]


@pytest.fixture
def ws(tmp_path):
    return fast_workspace(tmp_path / "ws", correctness_rounds=1, call_timeout_s=600)


@pytest.mark.parametrize("how", ["stdin closed", "SIGTERM", "SIGINT"])
def test_a_stdio_server_that_stops_says_so_of_its_jobs(ws, how):
    srv = StdioServer(ws, "alice")
    try:
        running, queued = submit_two(srv, ws)
        if how == "stdin closed":  # what the MCP Inspector does when it exits
            srv.close_stdin()
        else:
            srv.proc.send_signal(getattr(signal, how))
        assert srv.wait(30) == 0, srv.log()
    finally:
        srv.kill()
    j = job(ws, running)
    assert j["state"] == "interrupted", j
    assert j["error"] == f"the server stopped ({how}) while judging it; resubmit to judge"
    j = job(ws, queued)
    assert j["state"] == "cancelled", j
    assert j["error"] == f"the server stopped ({how}) before judging it; resubmit to judge"
    # the candidate being judged: interrupted for the same reason, not a worker's crash nor a verdict
    cands = rows(ws, "SELECT state, decision, status, reason FROM candidates")
    assert cands == [
        {
            "state": "interrupted",
            "decision": None,
            "status": None,
            "reason": f"the server stopped ({how}) while judging it; resubmit to judge",
        }
    ]
    assert rows(ws, "SELECT stopped_by FROM servers") == [{"stopped_by": how}]


@pytest.mark.anyio
async def test_the_next_server_resolves_the_jobs_of_a_killed_one(ws):
    srv = StdioServer(ws, "alice")
    try:
        running, queued = submit_two(srv, ws)
        # a server starting beside a live one leaves the live one's jobs alone
        g = make_guard(ws)
        try:
            JobQueue(g, autostart=False)
        finally:
            g.close()
        assert job(ws, running)["state"] == "running" and job(ws, queued)["state"] == "queued"
        srv.proc.send_signal(signal.SIGKILL)
        srv.wait(30)
    finally:
        srv.kill()
    assert job(ws, running)["state"] == "running" and job(ws, queued)["state"] == "queued"  # nobody said so

    service = make_service(ws)  # the next server
    try:
        j = job(ws, running)
        assert j["state"] == "interrupted"
        assert "ended while judging it, without a clean stop (killed or crashed); resubmit" in j["error"]
        assert job(ws, queued)["state"] == "cancelled"
        async with Client(build_server(service, http_auth=False, stdio_agent="alice"), mode="legacy") as c:
            # what the agent that submitted them sees, through the tools
            res = (await c.call_tool("get_result", {"job_id": running, "wait_s": 0})).structured_content
            assert res["state"] == "interrupted" and "without a clean stop" in res["message"], res
            res = (await c.call_tool("get_result", {"job_id": queued, "wait_s": 5})).structured_content
            assert res["state"] == "cancelled" and "before judging it" in res["message"], res
            # and a new submission waits behind nothing
            res = (
                await c.call_tool("submit_candidate", {"problem": RMS, "source": honest_source(), "wait_s": 0})
            ).structured_content
            assert res["state"] in ("queued", "running") and res.get("position", 0) == 0, res
            fresh = res["job_id"]
    finally:
        service.close()
    j = job(ws, fresh)  # a server closed in-process says so too (unless it had judged it already)
    assert j["state"] == "done" or j["error"] == "the server stopped (closed) while judging it; resubmit to judge", j


@pytest.mark.anyio
async def test_an_http_server_stopped_by_sigterm_says_so_of_its_jobs(ws):
    """As a swarm stops its own server when it ends."""
    srv = HttpServer(ws, "--allow-anonymous")
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            async with Client(streamable_http_client(srv.url, http_client=http), mode="legacy") as c:
                ids = []
                for source in (unique(ENDLESS.read_text()), honest_source()):
                    r = await c.call_tool("submit_candidate", {"problem": RMS, "source": source, "wait_s": 0})
                    ids.append(r.structured_content["job_id"])
        until(lambda: job(ws, ids[0])["state"] == "running")
    finally:
        srv.stop()
    assert srv.proc.returncode == 0
    assert job(ws, ids[0])["error"] == "the server stopped (SIGTERM) while judging it; resubmit to judge"
    assert job(ws, ids[1])["error"] == "the server stopped (SIGTERM) before judging it; resubmit to judge"


def test_http_workers_queue_jobs_for_the_evaluating_server(ws, monkeypatch):
    """``serve --workers N``: a job an HTTP worker queues names the serving process, so that the
    serving process cancels it when it stops."""
    import json

    from kernelarc_mcp.serving import app

    options = {
        "workspace": str(ws),
        "device": "cpu",
        "host": "127.0.0.1",
        "port": 0,
        "allow_anonymous": True,
        "max_wait": 40.0,
        "retention_days": None,
        "retention_per_problem": None,
        "server": "s-evaluating",
    }
    monkeypatch.setenv(app.ENV, json.dumps(options))
    monkeypatch.setattr(app, "build_app", lambda service, options: service)
    worker_service = app.create_app()
    try:
        job_id = worker_service.submit("anonymous", RMS, source=honest_source())
    finally:
        worker_service.close()
    assert job(ws, job_id)["server"] == "s-evaluating" and job(ws, job_id)["state"] == "queued"


def test_jobs_an_earlier_version_left_running_are_interrupted(ws):
    """A workspace from before jobs named their server: its running job cannot be judging
    anywhere now (an earlier server re-queued every running job at its start), so it is
    interrupted; a queued one stays for whichever server judges it."""
    from guard.archive.db import Database

    db = Database(ws / "workspace.db")
    db.reader().execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, agent TEXT NOT NULL, problem TEXT NOT NULL,"
        " solution_json TEXT NOT NULL, notes TEXT, parent TEXT, state TEXT NOT NULL, candidate_id TEXT,"
        " error TEXT, created_at REAL NOT NULL, started_at REAL, finished_at REAL)"
    )
    for jid, state in (("j-old-running", "running"), ("j-old-queued", "queued")):
        db.reader().execute(
            "INSERT INTO jobs (id, agent, problem, solution_json, state, created_at) VALUES (?,?,?,?,?,?)",
            (jid, "alice", RMS, "{}", state, time.time()),
        )
    g = make_guard(ws)
    try:
        JobQueue(g, autostart=False)
    finally:
        g.close()
    assert job(ws, "j-old-running")["state"] == "interrupted"
    assert "without a clean stop" in job(ws, "j-old-running")["error"]
    assert job(ws, "j-old-queued")["state"] == "queued"


def test_a_server_is_known_by_its_pid_and_start_time():
    me = os.getpid()
    identity = process_identity(me)
    if identity is None:
        pytest.skip("no /proc here: the pid alone is checked")
    host = socket.gethostname()
    assert alive(me, host, identity)
    assert not alive(me, host, identity + "0")  # the same pid, another process: a reused pid
    assert alive(me, "another-host", "anything")  # cannot be checked from here: left alone


def test_a_job_that_reaches_its_next_step_as_the_server_stops_says_the_server_stopped(ws, monkeypatch):
    """The stop and the evaluation race: the evaluation sees the stop at its next step and ends
    (``Stopping``) perhaps before the stop's transaction marks the running jobs. Whichever is
    first, the job says the server stopped while judging it, never "internal error: Stopping"
    (seen once the candidates' workers started in milliseconds, session 32)."""
    from guard.candidates.load import from_source

    g = make_guard(ws)
    try:
        queue = JobQueue(g, autostart=False)
        job_id = queue.submit("alice", RMS, from_source(honest_source(), None, "kernel.py"))
        claimed = queue._claim(g)
        assert claimed is not None and claimed["id"] == job_id

        def evaluate(*args, progress, **kwargs):
            queue._stop = True  # the stop has begun, and this evaluation reaches its next step first
            progress("build", 0, 1, "")

        monkeypatch.setattr(g, "evaluate", evaluate)
        queue._run(claimed, g)
        assert job(ws, job_id)["state"] == "running"  # left for the stop to say
        queue.stop("closed")
        j = job(ws, job_id)
        assert (
            j["state"] == "interrupted"
            and j["error"] == "the server stopped (closed) while judging it; resubmit to judge"
        )
    finally:
        g.close()
