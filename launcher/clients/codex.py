"""Codex, headless: ``codex exec --json`` with the run's MCP server set through ``-c``
overrides. ``default_tools_approval_mode = "approve"`` is needed: ``codex exec`` cancels MCP
calls it has not been allowed to make."""

from __future__ import annotations

from .base import AgentContext, Launch, agent_env, copy_credentials, find_executable


def mcp_overrides(url: str) -> list[str]:
    return [
        "-c",
        f'mcp_servers.kernelarc.url="{url}"',
        "-c",
        'mcp_servers.kernelarc.bearer_token_env_var="KERNELARC_TOKEN"',
        "-c",
        'mcp_servers.kernelarc.default_tools_approval_mode="approve"',
        "-c",
        "mcp_servers.kernelarc.tool_timeout_sec=120",
    ]


class CodexClient:
    name = "codex"
    restarts_on_redraft = True

    def prepare(self, ctx: AgentContext) -> None:
        ctx.home.mkdir(parents=True, exist_ok=True)
        (ctx.home / "STRATEGY.md").write_text(ctx.strategy_text)
        copy_credentials(ctx, [".codex/auth.json", ".codex/config.toml"])

    def command(self, ctx: AgentContext, prompt: str, resume: str | None = None) -> Launch:
        # Codex takes no separate system prompt here: the strategy leads the prompt.
        argv = [
            find_executable("KERNELARC_CODEX", "codex"),
            "exec",
            "--json",
            "--skip-git-repo-check",
            "-C",
            str(ctx.worktree),
            "--sandbox",
            "workspace-write",
            *mcp_overrides(ctx.server_url),
        ]
        if ctx.model:
            argv += ["-m", ctx.model]
        argv.append(ctx.strategy_text + "\n\n" + prompt)
        return Launch(argv, ctx.worktree, agent_env(ctx))

    def session_id(self, ctx: AgentContext) -> str | None:
        return None  # restarted fresh with the redraft prompt (it carries what was tried)
