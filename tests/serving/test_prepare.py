"""`kernelarc serve --prepare PROBLEM` (what `kernelarc launch` passes): the problem's
baselines are measured at start, before any candidate, so the first verdict does not wait
for them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from guard.archive.db import Database
from guard.problems.derive import workload_set
from guard.workspace import Workspace

from helpers import REPO, HttpServer, fast_workspace

PROBLEM = "rmsnorm_llama3_8b"


def test_serve_measures_the_named_problems_baselines_before_any_candidate(tmp_path):
    ws_path = fast_workspace(tmp_path / "ws")
    srv = HttpServer(ws_path, "--prepare", PROBLEM)
    try:
        ws = Workspace.open(ws_path)
        problem = ws.problems().get(PROBLEM)
        visible = {w.uuid for w in workload_set(problem, "cpu", ws.secret, ws.config().cpu_workloads).visible}
        dhash = problem.definition.content_hash()
        db = Database(ws_path / "workspace.db")
        deadline = time.monotonic() + 180
        measured: set[str] = set()
        while time.monotonic() < deadline and measured != visible:
            time.sleep(0.5)
            measured = {
                r["workload"] for r in db.query("SELECT workload FROM baselines WHERE definition_hash = ?", (dhash,))
            }
        assert measured == visible, (sorted(measured), (ws_path / f"serve-{srv.port}.log").read_text()[-2000:])
        rows = db.query("SELECT result_json FROM baselines WHERE definition_hash = ?", (dhash,))
        assert all(json.loads(r["result_json"])["eager"]["median_ms"] > 0 for r in rows)
    finally:
        srv.stop()


def test_serve_refuses_to_prepare_an_unknown_problem(tmp_path):
    ws_path = fast_workspace(tmp_path / "ws")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelarc_mcp.cli",
            "--workspace",
            str(ws_path),
            "serve",
            "--transport",
            "http",
            "--port",
            "0",
            "--device",
            "cpu",
            "--prepare",
            "no_such_problem",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "cannot prepare 'no_such_problem'" in out.stderr
