from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass
class AgentContext:
    name: str
    strategy: str  # name of a playbooks/strategies/*.md
    strategy_text: str  # the strategy prompt with the problem filled in
    problem: str
    worktree: Path
    folder: Path  # the agent's folder in the run (logs, configuration)
    server_url: str
    token: str
    model: str | None = None
    max_candidates: int | None = None
    budget_s: float | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.folder / "agent.log"

    @property
    def home(self) -> Path:
        """The agent's own HOME: its client's configuration and sessions. With the worktree,
        the only folders a confined agent may write (``launcher.confine``); the launcher's
        files (the log, the command) lie beside them, out of its reach."""
        return self.folder / "home"


@dataclass
class Launch:
    argv: list[str]
    cwd: Path
    env: dict[str, str]


class AgentClient(Protocol):
    name: str
    restarts_on_redraft: bool  # the launcher restarts it with a redraft prompt

    def prepare(self, ctx: AgentContext) -> None: ...

    def command(self, ctx: AgentContext, prompt: str, resume: str | None = None) -> Launch: ...

    def session_id(self, ctx: AgentContext) -> str | None: ...


def find_executable(env_var: str, name: str) -> str:
    """``$env_var`` if set, else ``name`` on the PATH."""
    exe = os.environ.get(env_var) or shutil.which(name)
    if not exe:
        raise FileNotFoundError(
            f"{name} is not installed (or set {env_var} to its path); the scripted client needs nothing"
        )
    return exe


def agent_env(ctx: AgentContext) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ctx.extra_env)
    env["HOME"] = str(ctx.home)
    env["KERNELARC_TOKEN"] = ctx.token
    env["KERNELARC_URL"] = ctx.server_url
    return env


def copy_credentials(ctx: AgentContext, names: list[str]) -> None:
    """The user's files ``names`` (relative to their HOME: a client's login and settings), where
    they exist, copied into the agent's own HOME, which the agent may write: the user's stay
    out of its reach (a red team's agent set ``core.hooksPath`` in the user's ``.gitconfig``,
    which the server's git would have run)."""
    user_home = Path(os.environ.get("HOME") or Path.home())
    for name in names:
        source, target = user_home / name, ctx.home / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            target.chmod(0o600)
