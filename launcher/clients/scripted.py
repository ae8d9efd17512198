"""The built-in scripted agent (``launcher/scripted_agent.py``): no model, a real MCP client."""

from __future__ import annotations

import sys

from .base import AgentContext, Launch, agent_env


class ScriptedClient:
    name = "scripted"
    restarts_on_redraft = False  # it follows the advice itself

    def prepare(self, ctx: AgentContext) -> None:
        pass

    def command(self, ctx: AgentContext, prompt: str, resume: str | None = None) -> Launch:
        argv = [
            sys.executable,
            "-m",
            "launcher.scripted_agent",
            "--url",
            ctx.server_url,
            "--problem",
            ctx.problem,
            "--strategy",
            ctx.strategy,
            "--name",
            ctx.name,
        ]
        if ctx.max_candidates:
            argv += ["--max-candidates", str(ctx.max_candidates)]
        if ctx.budget_s:
            argv += ["--budget-s", str(int(ctx.budget_s))]
        return Launch(argv, ctx.worktree, agent_env(ctx))

    def session_id(self, ctx: AgentContext) -> str | None:
        return None
