"""The MCP Inspector CLI (0.15.0) against the real server, over stdio and HTTP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serving.npm import INSPECTOR, npm_bin

from helpers import RMS, HttpServer, fast_workspace


def kernelarc_exe() -> str:
    exe = Path(sys.executable).parent / "kernelarc"
    return str(exe) if exe.exists() else shutil.which("kernelarc")


def inspector(*args: str, env: dict | None = None) -> dict:
    exe = npm_bin(INSPECTOR, "mcp-inspector")
    proc = subprocess.run(
        [str(exe), "--cli", *args], capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})}
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return fast_workspace(tmp_path_factory.mktemp("insp") / "ws")


def test_inspector_over_stdio(ws):
    server = ["-e", f"KERNELARC_WORKSPACE={ws}", "-e", "KERNELARC_AGENT=inspector", kernelarc_exe(), "serve"]
    tools = inspector(*server, "--method", "tools/list")
    assert {t["name"] for t in tools["tools"]} >= {"get_problem", "submit_candidate", "recall", "record", "peek_best"}
    status = inspector(*server, "--method", "tools/call", "--tool-name", "status")
    assert status["structuredContent"]["you"] == "inspector"
    prob = inspector(*server, "--method", "tools/call", "--tool-name", "get_problem", "--tool-arg", f"problem={RMS}")
    assert prob["isError"] is False and prob["structuredContent"]["name"] == RMS
    prompts = inspector(*server, "--method", "prompts/list")
    assert any(p["name"] == "strategy_tiling_autotune" for p in prompts["prompts"])


def test_inspector_over_http(ws):
    # Inspector 0.15.0 cannot send headers, so this server runs with anonymous access allowed
    srv = HttpServer(ws, "--allow-anonymous")
    try:
        out = inspector(srv.url, "--transport", "http", "--method", "tools/call", "--tool-name", "status")
        assert out["structuredContent"]["you"] == "anonymous"
        lst = inspector(srv.url, "--transport", "http", "--method", "tools/call", "--tool-name", "list_problems")
        assert any(p["name"] == RMS for p in lst["structuredContent"]["problems"])
    finally:
        srv.stop()
