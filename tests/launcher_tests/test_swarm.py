"""The launcher on the CPU: a scripted swarm end to end, status/stop/report, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, RMS, fast_workspace, kernelarc


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}/task") else []:
            try:
                kids = {int(x) for x in open(f"/proc/{p}/task/{task}/children").read().split()}
            except OSError:
                continue
            todo += list(kids - out)
            out |= kids
    return out


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_scripted_swarm_end_to_end(tmp_path):
    # Paired re-measurements (a Triton variant against its own Triton incumbent, in the
    # interpreter) with the fewest turns, two of each side: this test is about the swarm, not
    # the pairing's statistics (tests/test_pairing.py); with 4 turns one took 23 s of 2 cores.
    ws = fast_workspace(tmp_path / "ws", pairing_min_dof=1)
    out = kernelarc(
        ws,
        "launch",
        "--problem",
        RMS,
        "--agents",
        "2",
        "--client",
        "scripted",
        "--strategies",
        "library_precision",
        "tiling_autotune",
        "--max-candidates",
        "2",
        "--budget-minutes",
        "6",
        "--device",
        "cpu",
        "--json",
        "-q",
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    board = result["leaderboard"]
    assert len(board) == 2 and all(r["attempts"] == 2 for r in board), board
    assert all(r["accepted"] >= 1 for r in board)
    report = result["report"]
    folder = os.path.dirname(report)
    text = open(report).read()
    assert "## Leaderboard" in text and "score_over_time.png" in text
    assert os.path.getsize(os.path.join(folder, "score_over_time.png")) > 1000
    best = json.load(open(os.path.join(folder, "best", "solution.json")))
    assert best["definition"] == RMS and best["sources"]
    # conclusions were recorded with evidence by the agents
    from guard.archive.db import Database

    concl = Database(ws / "workspace.db").query("SELECT agent, evidence FROM conclusions")
    assert concl and all(c["evidence"].startswith("c-") for c in concl)
    from guard.archive.tokens import TokenStore
    from launcher import confine

    # the run's tokens ended with it
    assert not {r["agent"] for r in board} & {a["agent"] for a in TokenStore(Database(ws / "workspace.db")).agents()}
    # every agent ran confined away from the workspace (launcher.confine), and still worked
    commands = sorted((ws / "runs" / result["run"] / "agents").glob("*/command.json"))
    assert len(commands) == 2
    if confine.probe().binary is not None:
        for command in commands:
            assert json.loads(command.read_text())["confinement"].startswith("agents: confined"), command
    for command in commands:  # and below the guard's priority (launcher.limits)
        assert json.loads(command.read_text())["limits"].startswith("nice 19"), command
    status = json.loads(kernelarc(ws, "status", "--json").stdout.strip().splitlines()[-1])
    assert status["runs"][0]["state"] == "finished" and status["runs"][0]["candidates"] == 4
    again = kernelarc(ws, "report", result["run"], "--json")
    assert again.returncode == 0
    assert kernelarc(ws, "stop", check=False).returncode == 2  # nothing running


def test_stop_and_ctrl_c_leave_no_process(tmp_path):
    ws = fast_workspace(tmp_path / "ws")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernelarc_mcp.cli",
            "--workspace",
            str(ws),
            "launch",
            "--problem",
            RMS,
            "--agents",
            "2",
            "--client",
            "scripted",
            "--budget-minutes",
            "10",
            "--device",
            "cpu",
            "-q",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    kids: set[int] = set()
    while time.time() < deadline:
        kids = _descendants(proc.pid)
        if len(kids) >= 3:  # the server and two agents
            break
        time.sleep(0.5)
    assert len(kids) >= 3, "the swarm did not start"
    time.sleep(1)  # short: two scripted agents on a CPU-sized problem may run out of ideas in seconds
    kids = _descendants(proc.pid)
    assert proc.poll() is None, "the swarm ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(p) for p in kids):
        time.sleep(0.3)
    assert not [p for p in kids if _alive(p)], "processes outlived the launcher"
    status = json.loads(kernelarc(ws, "status", "--json").stdout.strip().splitlines()[-1])
    assert status["runs"][0]["ended"] == "interrupted"


def test_kernelarc_stop_ends_a_running_swarm(tmp_path):
    ws = fast_workspace(tmp_path / "ws")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernelarc_mcp.cli",
            "--workspace",
            str(ws),
            "launch",
            "--problem",
            RMS,
            "--agents",
            "1",
            "--client",
            "scripted",
            "--budget-minutes",
            "10",
            "--device",
            "cpu",
            "-q",
            "--json",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        st = kernelarc(ws, "status", "--json", check=False)
        runs = json.loads(st.stdout.strip().splitlines()[-1])["runs"] if st.returncode == 0 else []
        if runs and runs[0]["state"] == "running":
            break
        time.sleep(1)
    assert kernelarc(ws, "stop").returncode == 0
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    status = json.loads(kernelarc(ws, "status", "--json").stdout.strip().splitlines()[-1])
    assert status["runs"][0]["ended"] == "stopped by kernelarc stop"


def test_submissions_still_queued_are_judged_within_a_grace_period(tmp_path, monkeypatch):
    """Agents that have finished leave jobs in the queue: the swarm waits for them (bounded)
    before stopping its server, so the report holds every verdict."""
    import threading

    from guard.jobs import SCHEMA
    from guard.workspace import Workspace
    from launcher import swarm as swarm_mod

    ws = Workspace.open(fast_workspace(tmp_path / "ws"))
    s = swarm_mod.Swarm(ws, RMS, 1, "scripted")
    s.runs = [swarm_mod.AgentRun(spec=a, ctx=None) for a in s.config.agents]  # not started
    monkeypatch.setattr(swarm_mod, "POLL_S", 0.05)
    monkeypatch.setattr(swarm_mod.Swarm, "_refresh", lambda self, run: None)
    with s.db.transaction() as c:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                c.execute(statement)
        c.execute(
            "INSERT INTO jobs (id, agent, problem, solution_json, state, created_at) VALUES (?,?,?,?,?,?)",
            ("j1", s.runs[0].spec.name, RMS, "{}", "queued", time.time()),
        )
    notes = []
    s.on_update = lambda runs, note=None: notes.append(note)

    def judge_later():
        time.sleep(0.5)
        with s.db.transaction() as c:
            c.execute("UPDATE jobs SET state = 'done' WHERE id = 'j1'")

    # a grace far longer than the wait: a loaded machine's slower polls cannot reach it
    monkeypatch.setattr(swarm_mod, "GRACE_MIN_S", 120.0)
    monkeypatch.setattr(swarm_mod, "GRACE_MAX_S", 120.0)
    t = threading.Thread(target=judge_later)
    t0 = time.monotonic()
    t.start()
    s._judge_pending()
    t.join()
    assert 0.4 < time.monotonic() - t0 < 60.0  # waited for the job, not for the whole grace
    assert any(n and "judging 1 submitted" in n for n in notes)
    # a job that is never judged: the grace period bounds the wait
    with s.db.transaction() as c:
        c.execute("UPDATE jobs SET state = 'queued' WHERE id = 'j1'")
    monkeypatch.setattr(swarm_mod, "GRACE_MIN_S", 0.3)
    monkeypatch.setattr(swarm_mod, "GRACE_MAX_S", 0.3)
    t0 = time.monotonic()
    s._judge_pending()
    assert time.monotonic() - t0 < 20.0  # the 0.3 s grace, not the defaults' 30 s or more


def test_an_agent_at_its_candidate_cap_wraps_up_before_it_is_stopped(tmp_path, monkeypatch):
    """An agent whose last allowed candidate has its verdict is not killed at once (its call
    was still waiting for that verdict, and it had recorded nothing): it keeps running for a
    bounded wrap-up, ends as done when it exits by itself, and is stopped when the wrap-up
    runs out."""
    import subprocess

    from guard.workspace import Workspace
    from launcher import swarm as swarm_mod

    ws = Workspace.open(fast_workspace(tmp_path / "ws"))
    s = swarm_mod.Swarm(ws, RMS, 2, "claude", max_candidates=1)
    s.runs = [swarm_mod.AgentRun(spec=a, ctx=None) for a in s.config.agents]

    def at_cap(self, run):
        run.attempts = 1
        return None

    monkeypatch.setattr(swarm_mod.Swarm, "_refresh", at_cap)
    finishing, lingering = s.runs
    finishing.proc = subprocess.Popen(["sleep", "0.5"], start_new_session=True)  # as agents are started
    lingering.proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        s._step(finishing, time.monotonic() + 600)
        s._step(lingering, time.monotonic() + 600)
        assert finishing.state == lingering.state == "wrapping"
        assert finishing.proc.poll() is None and lingering.proc.poll() is None  # both still running
        finishing.proc.wait(timeout=30)
        s._step(finishing, time.monotonic() + 600)
        assert finishing.state == "done" and finishing.proc.returncode == 0  # ended by itself
        lingering.wrap_up_until = time.monotonic() - 1  # its wrap-up has run out
        s._step(lingering, time.monotonic() + 600)
        assert lingering.state == "done" and lingering.proc.poll() is not None  # stopped
    finally:
        for run in s.runs:
            if run.proc.poll() is None:
                run.proc.kill()
