"""Claude Code, headless: ``claude -p`` with the run's MCP server configured strictly."""

from __future__ import annotations

import json
import re

from .base import AgentContext, Launch, agent_env, copy_credentials, find_executable

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
# its login and settings, copied into the agent's own HOME
CREDENTIALS = [".claude.json", ".claude/.credentials.json", ".claude/settings.json"]
ALLOWED_TOOLS = "mcp__kernelarc Read Write Edit Glob Grep Bash(git add:*) Bash(git commit:*)"


class ClaudeClient:
    name = "claude"
    restarts_on_redraft = True

    def prepare(self, ctx: AgentContext) -> None:
        config = {
            "mcpServers": {
                "kernelarc": {
                    "type": "http",
                    "url": ctx.server_url,
                    "headers": {"Authorization": "Bearer ${KERNELARC_TOKEN}"},
                }
            }
        }
        ctx.home.mkdir(parents=True, exist_ok=True)
        (ctx.home / "mcp.json").write_text(json.dumps(config, indent=2))
        copy_credentials(ctx, CREDENTIALS)

    def command(self, ctx: AgentContext, prompt: str, resume: str | None = None) -> Launch:
        argv = [
            find_executable("KERNELARC_CLAUDE", "claude"),
            "-p",
            prompt,
            "--mcp-config",
            str(ctx.home / "mcp.json"),
            "--strict-mcp-config",
            "--allowedTools",
            ALLOWED_TOOLS,
            "--output-format",
            "stream-json",
            "--verbose",
            "--append-system-prompt",
            ctx.strategy_text,
            "--max-turns",
            "200",
        ]
        if ctx.model:
            argv += ["--model", ctx.model]
        if resume:
            argv += ["--resume", resume]
        env = agent_env(ctx)
        env.setdefault("MCP_TOOL_TIMEOUT", "120000")  # our tools answer within about 40 s
        # `claude -p` otherwise connects --mcp-config servers in the background and starts the
        # first turn without them: on a loaded machine the agent's first call of ours came back
        # "No such tool available". Wait for our server (up to a minute) before the first turn.
        env.setdefault("MCP_CONNECTION_NONBLOCKING", "false")
        env.setdefault("MCP_CONNECT_TIMEOUT_MS", "60000")
        return Launch(argv, ctx.worktree, env)

    def session_id(self, ctx: AgentContext) -> str | None:
        """From the stream-json log: the init event names the session, for --resume."""
        try:
            for line in ctx.log.read_text(errors="replace").splitlines():
                if line.startswith("{") and '"session_id"' in line:
                    event = json.loads(line)
                    sid = event.get("session_id") if isinstance(event, dict) else None
                    # the log is the agent's stdout, so the agent wrote it: a plain id or nothing
                    # (a red team's list crashed the launcher; a string could pose as a flag)
                    if isinstance(sid, str) and SESSION_ID.fullmatch(sid):
                        return sid
        except (OSError, ValueError):
            return None
        return None
