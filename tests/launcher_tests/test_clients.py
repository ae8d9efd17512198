"""Real agent CLIs in a swarm: two Claude Code agents driven by the fake Anthropic API, each
with its own token; the Codex command line and configuration."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from serving.fake_anthropic import FakeAnthropic
from serving.npm import CLAUDE_CODE, npm_bin

from launcher.clients import AgentContext, get_client

from helpers import RMS, fast_workspace, honest_source

SOURCE = honest_source()
FINAL = ("done", "error", "interrupted", "cancelled")


def _agent_plan(results: list) -> tuple[str, dict] | None:
    """One agent's turns: read the problem, submit, wait for the verdict however long the
    machine takes (a loaded one answers "still queued" several times), then record an insight
    tied to the candidate and peek at the best. Ends early, without a crash in the fake API,
    if the submission is refused or its job ends without a verdict: the test then says why."""
    if not results:
        return "get_problem", {"problem": RMS}
    if len(results) == 1:
        return "submit_candidate", {"problem": RMS, "source": SOURCE, "notes": "fp32 torch"}
    jobs = [(i, r) for i, r in enumerate(results) if isinstance(r, dict) and "job_id" in r]
    if not jobs:
        return None
    ended = next(((i, r) for i, r in jobs if r.get("state") in FINAL), None)
    if ended is None:
        return ("get_result", {"job_id": jobs[0][1]["job_id"], "wait_s": 600}) if len(results) < 40 else None
    at, job = ended
    if job["state"] != "done" or not job.get("candidate_id"):
        return None
    after = len(results) - at - 1
    if after == 0:
        text = "float32 torch passes every round"
        return "record", {"problem": RMS, "kind": "insight", "text": text, "evidence": job["candidate_id"]}
    return ("peek_best", {"problem": RMS}) if after == 1 else None


def _what_happened(ws: Path, run_dir: Path | None) -> str:
    """The jobs and candidates of the run, and the end of the server's log: enough to tell a
    refused or failed evaluation from a slow one when the assertion fails on a CI machine."""
    from guard.archive.db import Database

    db = Database(ws / "workspace.db")
    jobs = [dict(r) for r in db.query("SELECT agent, state, error, candidate_id FROM jobs")]
    cands = [dict(r) for r in db.query("SELECT agent, state, decision, reason FROM candidates")]
    log = (run_dir / "server.log").read_text()[-3000:] if run_dir and (run_dir / "server.log").is_file() else ""
    return f"jobs: {jobs}\ncandidates: {cands}\nserver log:\n{log}"


@pytest.mark.slow
def test_two_claude_code_agents_in_a_swarm(tmp_path):
    claude = npm_bin(CLAUDE_CODE, "claude")
    ws = fast_workspace(tmp_path / "ws")
    home = tmp_path / "home"
    home.mkdir()
    with FakeAnthropic(_agent_plan) as fake:
        env = {
            **os.environ,
            "KERNELARC_CLAUDE": str(claude),
            "ANTHROPIC_BASE_URL": fake.url,
            "ANTHROPIC_API_KEY": "sk-ant-test",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "HOME": str(home),
            "DISABLE_AUTOUPDATER": "1",
        }
        import subprocess
        import sys

        from helpers import REPO

        out = subprocess.run(
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
                "claude",
                "--max-candidates",
                "1",
                "--budget-minutes",
                "5",
                "--device",
                "cpu",
                "--json",
                "-q",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    board = result["leaderboard"]
    run_dir = Path(result["report"]).parents[1]
    assert len(board) == 2 and all(r["accepted"] == 1 for r in board), (board, _what_happened(ws, run_dir))
    from guard.archive.db import Database

    db = Database(ws / "workspace.db")
    agents = {r["agent"] for r in db.query("SELECT agent FROM candidates")}
    assert agents == {r["agent"] for r in board}  # each submission under its own token's agent
    recorded = {r["agent"] for r in db.query("SELECT agent FROM conclusions")}
    assert recorded <= agents and recorded
    # each agent's stream shows the MCP server connected with the kernelarc tools
    for agent in agents:
        log = (run_dir / "agents" / agent / "agent.log").read_text()
        init = next(json.loads(line) for line in log.splitlines() if '"subtype":"init"' in line)
        servers = [{"name": s["name"], "status": s["status"]} for s in init["mcp_servers"]]
        # connected before the first turn, not still "pending" (the launcher asks Claude Code to
        # wait for it), so that no call of the agent's finds our tools missing
        assert {"name": "kernelarc", "status": "connected"} in servers
        assert "No such tool available" not in log


def test_codex_command_and_configuration(tmp_path):
    ctx = AgentContext(
        name="a1",
        strategy="memory_fusion",
        strategy_text="Move fewer bytes.",
        problem=RMS,
        worktree=tmp_path,
        folder=tmp_path,
        server_url="http://127.0.0.1:9/mcp",
        token="ka_x",
        model="gpt-5-codex",
    )
    os.environ["KERNELARC_CODEX"] = "/usr/bin/true"
    try:
        launch = get_client("codex").command(ctx, "Optimize it.")
    finally:
        del os.environ["KERNELARC_CODEX"]
    argv = launch.argv
    assert argv[:3] == ["/usr/bin/true", "exec", "--json"]
    assert argv[argv.index("-C") + 1] == str(tmp_path) and argv[argv.index("--sandbox") + 1] == "workspace-write"
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert 'mcp_servers.kernelarc.url="http://127.0.0.1:9/mcp"' in overrides
    assert 'mcp_servers.kernelarc.default_tools_approval_mode="approve"' in overrides
    assert 'mcp_servers.kernelarc.bearer_token_env_var="KERNELARC_TOKEN"' in overrides
    assert launch.env["KERNELARC_TOKEN"] == "ka_x" and argv[argv.index("-m") + 1] == "gpt-5-codex"
    assert argv[-1].startswith("Move fewer bytes.") and "Optimize it." in argv[-1]


def test_claude_command(tmp_path):
    ctx = AgentContext(
        name="a1",
        strategy="tiling_autotune",
        strategy_text="Tile it.",
        problem=RMS,
        worktree=tmp_path,
        folder=tmp_path,
        server_url="http://127.0.0.1:9/mcp",
        token="ka_y",
    )
    client = get_client("claude")
    client.prepare(ctx)
    os.environ["KERNELARC_CLAUDE"] = "/usr/bin/true"
    try:
        launch = client.command(ctx, "Go.", resume="sess-1")
    finally:
        del os.environ["KERNELARC_CLAUDE"]
    argv = launch.argv
    cfg = json.loads((tmp_path / "home" / "mcp.json").read_text())  # in the agent's own HOME
    assert cfg["mcpServers"]["kernelarc"]["headers"]["Authorization"] == "Bearer ${KERNELARC_TOKEN}"
    for flag in ("--strict-mcp-config", "--verbose"):
        assert flag in argv
    assert argv[argv.index("--output-format") + 1] == "stream-json"
    assert argv[argv.index("--append-system-prompt") + 1] == "Tile it."
    assert "mcp__kernelarc" in argv[argv.index("--allowedTools") + 1]
    assert argv[argv.index("--resume") + 1] == "sess-1"


def test_scripted_agent_varies_tile_sizes_and_never_repeats_a_source():
    from launcher.scripted_agent import variants

    src = "k[(n,)](x, y, BLOCK=4096, num_warps=8)\nBLOCK_SIZE = 16\n"
    changes = [n for _, n in variants(src)]
    assert "BLOCK 4096 -> 2048" in changes and "BLOCK 4096 -> 16384" in changes
    assert "BLOCK_SIZE 16 -> 32" in changes and not any("BLOCK_SIZE 16 -> 8" in c for c in changes)
    cuda = "__global__ void k() {}\nconstexpr int BM = 64, BN = 64;\n"
    assert variants(cuda) == []  # CUDA tiles are tied to the kernel's thread layout
    sources = [s for s, _ in variants(src)]
    assert len(sources) == len(set(sources)) and src not in sources


def test_scripted_agent_starts_from_the_reference_where_a_problem_has_no_seeds():
    """A problem that ``kernelarc profile --top`` imports has no seed kernels, and the tools'
    compact encoding leaves the empty field out: the scripted agent failed on it with a
    KeyError before its first submission (found trying the README as a new user)."""
    from launcher.scripted_agent import Agent

    agent = Agent(None, "p", "algorithm_redraft", "a-1", max_candidates=1, budget_s=None)
    starts = agent.starts({"reference": "def run(x):\n    return x\n"}, "cpu")
    assert starts == [("reference", "pytorch", "def run(x):\n    return x\n")]


def test_scripted_agent_climbs_from_accepted_variants_and_ends():
    """Agent.run against a scripted server: every BLOCK halving is faster (ACCEPT), the rest
    slower (REVERT). The agent climbs BLOCK down step by step, never submits a source twice,
    and ends when nothing is left to try."""
    import re

    import anyio

    from launcher.scripted_agent import Agent

    seed = "def run(x):\n    k[(1,)](x, BLOCK=4096, num_warps=8)\n    return x\n"
    submitted: list[str] = []

    class Server:
        best = 4096

        async def call(self, name, args):
            if name == "get_problem":
                return {"seed_kernels": {"seed_triton.py": seed}, "reference": "def run(x):\n    return x\n"}
            if name == "status":
                return {"device": {"kind": "cpu"}}
            if name == "submit_candidate":
                src = args["source"]
                submitted.append(src)
                m = re.search(r"BLOCK=(\d+)", src)
                block = int(m.group(1)) if m else None
                faster = block is not None and block < self.best and "num_warps=8" in src
                if faster:
                    self.best = block
                verdict = {
                    "candidate_id": f"c{len(submitted)}",
                    "decision": "ACCEPT" if faster else "REVERT",
                    "status": "PASSED",
                    "reason": "",
                    "speedup_vs_best": 1.1 if faster else 0.9,
                    "speedup_eager": 1.0,
                    "advice": {"action": "continue", "message": ""},
                }
                return {"state": "done", "verdict": verdict}
            if name == "peek_best":
                return {"global_best": None}
            return {}

    server = Server()
    agent = Agent(None, "p", "memory_fusion", "a", max_candidates=200, budget_s=None)

    async def tool(name, **args):
        return await server.call(name, args)

    agent.tool = tool
    anyio.run(agent.run)
    assert len(submitted) == len(set(submitted)), "a source was submitted twice"
    assert server.best == 16  # climbed 4096 -> 2048 -> ... -> 16, the smallest tile tried
    assert len(submitted) < 200  # ended by running out of variants, not by the budget


def test_scripted_agent_varies_gemm_tiles_set_by_name_and_the_variants_compute_the_same(tmp_path):
    """The Triton GEMM seeds set their tiles in one assignment and pass them by name; the
    agent halves and doubles each, and the variants (through Triton's interpreter) still
    compute the seed's product."""
    import torch

    from guard.runner.common import load_module_from_source
    from launcher.scripted_agent import variants
    from seeds import SEEDS_DIR

    src = (SEEDS_DIR / "matmul_bf16_llm_projections" / "seed_triton.py").read_text()
    found = dict((n, s) for s, n in variants(src))
    assert {"BM 64 -> 32", "BN 64 -> 128", "BK 32 -> 16", "BK 32 -> 64"} <= set(found), sorted(found)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(40, 96, generator=gen).to(torch.bfloat16)
    w = torch.randn(72, 96, generator=gen).to(torch.bfloat16)
    want = load_module_from_source(src, tmp_path / "seed", "seed").run(x, w)
    for change in ("BM 64 -> 32", "BK 32 -> 16"):
        got = load_module_from_source(found[change], tmp_path / "v", "variant").run(x, w)
        assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2), change
