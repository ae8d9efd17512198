"""Running the real Claude Code CLI headless against the fake API and a KernelArc server."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from serving.npm import CLAUDE_CODE, npm_bin


def run_claude(
    fake_url: str, mcp_url: str, token: str, workdir: Path, prompt: str = "Optimize the kernel.", timeout: float = 600
) -> list[dict]:
    """Runs ``claude -p`` once; returns its stream-json events."""
    exe = npm_bin(CLAUDE_CODE, "claude")
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    config = workdir / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "kernelarc": {
                        "type": "http",
                        "url": mcp_url,
                        "headers": {"Authorization": "Bearer ${KERNELARC_TOKEN}"},
                    }
                }
            }
        )
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": fake_url,
        "ANTHROPIC_API_KEY": "sk-ant-test-dummy",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "KERNELARC_TOKEN": token,
        "MCP_TOOL_TIMEOUT": "300000",
        "DISABLE_AUTOUPDATER": "1",
    }
    proc = subprocess.run(
        [
            str(exe),
            "-p",
            prompt,
            "--mcp-config",
            str(config),
            "--strict-mcp-config",
            "--allowedTools",
            "mcp__kernelarc",
            "--output-format",
            "stream-json",
            "--verbose",
            "--max-turns",
            "12",
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert events, f"no output from claude (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return events


def tool_results(events: list[dict]) -> list[dict]:
    out = []
    for e in events:
        if e.get("type") == "user":
            for block in e.get("message", {}).get("content", []):
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    out.append(block)
    return out
