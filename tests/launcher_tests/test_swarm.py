"""The launcher on the CPU: a scripted swarm end to end, status/stop/report, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

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


def test_scripted_swarm_end_to_end(tmp_path):
    ws = fast_workspace(tmp_path / "ws")
    out = kernelarc(ws, "launch", "--problem", RMS, "--agents", "2", "--client", "scripted",
                    "--strategies", "library_precision", "tiling_autotune", "--max-candidates", "2",
                    "--budget-minutes", "6", "--device", "cpu", "--json", "-q", timeout=600)
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
    status = json.loads(kernelarc(ws, "status", "--json").stdout.strip().splitlines()[-1])
    assert status["runs"][0]["state"] == "finished" and status["runs"][0]["candidates"] == 4
    again = kernelarc(ws, "report", result["run"], "--json")
    assert again.returncode == 0
    assert kernelarc(ws, "stop", check=False).returncode == 2  # nothing running


def test_stop_and_ctrl_c_leave_no_process(tmp_path):
    ws = fast_workspace(tmp_path / "ws")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelarc_mcp.cli", "--workspace", str(ws), "launch", "--problem", RMS,
         "--agents", "2", "--client", "scripted", "--budget-minutes", "10", "--device", "cpu", "-q"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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
        [sys.executable, "-m", "kernelarc_mcp.cli", "--workspace", str(ws), "launch", "--problem", RMS,
         "--agents", "1", "--client", "scripted", "--budget-minutes", "10", "--device", "cpu", "-q", "--json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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
