"""The real Claude Code CLI, driven by a fake Anthropic API, uses the server's tools with
its own identity: get_problem, submit_candidate, record, peek_best."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from serving.claude import run_claude, tool_results
from serving.fake_anthropic import FakeAnthropic

from helpers import RMS, HttpServer, fast_workspace, honest_source, token

SOURCE = honest_source()


def _candidate(results):
    submitted = next(r for r in results if isinstance(r, dict) and "job_id" in r)
    return submitted["candidate_id"]


SCRIPT = [
    ("get_problem", {"problem": RMS}),
    ("submit_candidate", {"problem": RMS, "source": SOURCE, "notes": "fp32 torch from claude"}),
    lambda results: (
        "record",
        {
            "problem": RMS,
            "kind": "insight",
            "evidence": _candidate(results),
            "text": "float32 arithmetic in plain torch passes every round",
        },
    ),
    ("peek_best", {"problem": RMS, "k": 2}),
]


@pytest.mark.slow
def test_claude_code_drives_the_tools(tmp_path):
    ws = fast_workspace(tmp_path / "ws")
    tok = token(ws, "claude-1")
    srv = HttpServer(ws)
    try:
        with FakeAnthropic(SCRIPT) as fake:
            events = run_claude(fake.url, srv.url, tok, tmp_path / "agent")
    finally:
        srv.stop()
    init = next(e for e in events if e.get("type") == "system" and e.get("subtype") == "init")
    assert {"name": "kernelarc", "status": "connected"} in [
        {"name": s["name"], "status": s["status"]} for s in init["mcp_servers"]
    ]
    assert "mcp__kernelarc__submit_candidate" in init["tools"]
    results = tool_results(events)
    assert len(results) == 4 and not any(r.get("is_error") for r in results), results
    final = events[-1]
    assert final["type"] == "result" and final["subtype"] == "success", final
    # the tools saw the token's agent, not anything the model said
    sent = [r for r in fake.requests if r.get("tools")]
    assert any(t["name"] == "mcp__kernelarc__record" for t in sent[0]["tools"])
    from guard.archive.db import Database

    db = Database(ws / "workspace.db")
    cands = db.query("SELECT agent, decision FROM candidates")
    assert [(c["agent"], c["decision"]) for c in cands] == [("claude-1", "ACCEPT")]
    concl = db.query("SELECT agent, text FROM conclusions")
    assert concl[0]["agent"] == "claude-1"
    peek = json.loads(results[3]["content"])  # Claude Code hands the structured result over as JSON text
    assert peek["global_best"]["agent"] == "claude-1"


@pytest.mark.slow
def test_a_swarm_agent_cannot_read_the_workspace_secret(monkeypatch):
    """A swarm's agent runs as the user who started the swarm, its worktree inside the
    workspace: Claude Code's Read reached the workspace's secret (which keys the held-out
    workloads) and other processes' environments (the other agents' tokens), and a Grep of
    the workspace printed the secret even under a deny rule for Read (red team, session 42).
    Run as the launcher runs it (``launcher.confine``), the real CLI finds neither, and still
    reads and searches its own folder."""
    import os
    import shutil
    import sys

    from guard.workspace import Workspace
    from launcher import confine
    from launcher.clients import get_client
    from launcher.clients.base import AgentContext
    from serving.npm import CLAUDE_CODE, npm_bin

    confinement = confine.probe()
    if confinement.binary is None:
        pytest.skip(confinement.line)
    # outside /tmp: the agent's /tmp is its own, which would hide a workspace there anyway
    base = Path.home() / ".cache" / "kernelarc-tests" / f"claude-secret-{os.getpid()}"
    shutil.rmtree(base, ignore_errors=True)
    ws = Workspace.open(fast_workspace(base / "ws"))
    sibling = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={"KERNELARC_TOKEN": "ka_sibling_token"}
    )
    try:
        secret = ws.secret.hex()
        folder = ws.root / "runs" / "r1" / "agents" / "a1"
        (folder / "worktree").mkdir(parents=True)
        (folder / "worktree" / "kernel.py").write_text("OWN = 1\n")
        ctx = AgentContext(
            name="a1",
            strategy="tiling_autotune",
            strategy_text="Tile it.",
            problem=RMS,
            worktree=folder / "worktree",
            folder=folder,
            server_url="http://127.0.0.1:9/mcp",  # nothing there: this test calls no tool of ours
            token="ka_test",
        )
        client = get_client("claude")
        client.prepare(ctx)
        script = [
            ("Read", {"file_path": str(ws.secret_path)}),
            ("Read", {"file_path": f"/proc/{sibling.pid}/environ"}),
            ("Grep", {"pattern": "[0-9a-f]{64}", "path": str(ws.root), "output_mode": "content"}),
            ("Grep", {"pattern": "OWN", "path": str(ws.root), "output_mode": "content"}),
        ]
        monkeypatch.setenv("KERNELARC_CLAUDE", str(npm_bin(CLAUDE_CODE, "claude")))
        with FakeAnthropic(script) as fake:
            launch = client.command(ctx, "Optimize the kernel.")
            env = dict(
                launch.env,
                ANTHROPIC_BASE_URL=fake.url,
                ANTHROPIC_API_KEY="sk-ant-test-dummy",
                CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                DISABLE_AUTOUPDATER="1",
                MCP_CONNECTION_NONBLOCKING="true",
                MCP_CONNECT_TIMEOUT_MS="1000",
            )
            argv = confine.command(confinement.binary, launch.argv, ws.root, [ctx.worktree, ctx.home])
            proc = subprocess.run(
                argv, cwd=launch.cwd, env=confine.environment(env), capture_output=True, text=True, timeout=300
            )
    finally:
        sibling.kill()
        sibling.wait()
        shutil.rmtree(base, ignore_errors=True)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    results = tool_results(events)
    assert len(results) == 4, (proc.returncode, proc.stderr[-2000:], results)
    texts = [json.dumps(r.get("content")) for r in results]
    assert results[0].get("is_error") and secret not in texts[0], results[0]
    assert results[1].get("is_error") and "ka_sibling_token" not in texts[1], results[1]
    assert secret not in texts[2], results[2]
    assert "OWN = 1" in texts[3], results[3]  # its own folder is there, searched through the workspace's path
