"""The real Claude Code CLI, driven by a fake Anthropic API, uses the server's tools with
its own identity: get_problem, submit_candidate, record, peek_best."""

from __future__ import annotations

import json

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
