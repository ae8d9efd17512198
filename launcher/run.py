"""A swarm run: its configuration and its folder under ``<workspace>/runs/<run id>/``.

```
runs/<id>/run.json          the configuration, the launcher's pid, the server URL
runs/<id>/repo/             a git repository with the brief, seeds and guide
runs/<id>/agents/<name>/    each agent's (0700): worktree/ (its own clone, branch
                            agent/<name>) and home/ (its client's configuration), the only
                            folders it may write, and the launcher's files beside them
                            (agent.log, command.json, strategy.md), out of its reach
runs/<id>/server.log        the server's log when the launcher started it
runs/<id>/report/           what `kernelarc report` writes
runs/<id>/STOP              created by `kernelarc stop`: the launcher winds down
```
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from .limits import AgentLimits

Client = Literal["claude", "codex", "scripted"]


class AgentSpec(BaseModel):
    name: str
    strategy: str
    client: Client
    model: str | None = None


class RunConfig(BaseModel):
    run_id: str
    problem: str
    agents: list[AgentSpec]
    client: Client
    budget_minutes: float = Field(30.0, gt=0)
    max_candidates: int | None = Field(None, ge=1, description="per agent")
    device: str = "auto"
    devices: str = Field("1", description="GPUs of the host that judge: N or 'all' (the server's --devices)")
    server_url: str | None = None  # None: the launcher starts one
    started_at: float = Field(default_factory=time.time)
    launcher_pid: int = Field(default_factory=os.getpid)
    stall_minutes: float = Field(10.0, gt=0, description="restart an agent silent this long")
    agent_limits: AgentLimits = Field(default_factory=AgentLimits)


def new_run_id(problem: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + problem[:24] + "-" + uuid.uuid4().hex[:4]


class RunFolder:
    def __init__(self, workspace_root: Path, run_id: str):
        self.root = Path(workspace_root) / "runs" / run_id
        self.run_id = run_id

    @property
    def config_path(self) -> Path:
        return self.root / "run.json"

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def stop_file(self) -> Path:
        return self.root / "STOP"

    def agent_dir(self, name: str) -> Path:
        return self.root / "agents" / name

    def save(self, config: RunConfig, **extra) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = config.model_dump(mode="json")
        if self.config_path.exists():
            data = {**json.loads(self.config_path.read_text()), **data}
        data.update(extra)
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.config_path)

    def load(self) -> dict:
        return json.loads(self.config_path.read_text())

    @staticmethod
    def all(workspace_root: Path) -> list[RunFolder]:
        base = Path(workspace_root) / "runs"
        if not base.is_dir():
            return []
        return [RunFolder(workspace_root, p.name) for p in sorted(base.iterdir()) if (p / "run.json").is_file()]
