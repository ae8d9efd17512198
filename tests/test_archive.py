"""The workspace database survives a kill -9 in mid-evaluation; workers die with their guard."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from guard.archive.db import Database

from helpers import CHEATS, REPO, RMS, fast_workspace


def _children(pid: int) -> set[int]:
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out |= {int(x) for x in open(f"/proc/{pid}/task/{task}/children").read().split()}
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except OSError:
        return False


def test_kill_9_loses_no_finished_result(tmp_path):
    ws = fast_workspace(tmp_path / "ws", correctness_rounds=1, call_timeout_s=300)
    base = [
        sys.executable,
        "-m",
        "kernelarc_mcp.cli",
        "--workspace",
        str(ws),
        "submit",
        "--problem",
        RMS,
        "--device",
        "cpu",
        "--json",
        "-q",
    ]
    done = subprocess.run(
        base + [str(CHEATS / "honest_torch.py")], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert done.returncode == 0, done.stderr
    finished = json.loads(done.stdout.strip().splitlines()[-1])

    proc = subprocess.Popen(
        base + [str(CHEATS / "infinite_loop.py")], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    db = Database(ws / "workspace.db")
    deadline = time.time() + 120
    running = None
    while time.time() < deadline and running is None:
        time.sleep(0.5)
        rows = db.query("SELECT id FROM candidates WHERE state = 'running'")
        running = rows[0]["id"] if rows else None
    assert running, "the second evaluation never started"
    time.sleep(6)  # well inside the candidate's endless call
    workers = _children(proc.pid)
    assert workers, "the guard should have worker processes"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers), "workers outlived their guard"

    db2 = Database(ws / "workspace.db")  # opening marks the orphaned evaluation
    row = db2.candidate(running)
    assert row["state"] == "interrupted"
    kept = db2.candidate(finished["candidate_id"])
    assert kept["state"] == "done" and kept["decision"] == "ACCEPT"
    assert json.loads(kept["verdict_json"])["candidate_id"] == finished["candidate_id"]
    assert db2.workload_results(finished["candidate_id"])
    conn = sqlite3.connect(ws / "workspace.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
