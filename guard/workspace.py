"""A workspace: the folder holding the database, imported problems, the git archive and the
secret that keys held-out workloads and input seeds. Default ``./.kernelarc``."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import GuardConfig
from .problems.store import ProblemStore

ENV_WORKSPACE = "KERNELARC_WORKSPACE"
DEFAULT_WORKSPACE = ".kernelarc"


def resolve_workspace_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    raw = explicit or os.environ.get(ENV_WORKSPACE) or DEFAULT_WORKSPACE
    return Path(raw).expanduser().resolve()


@dataclass
class Workspace:
    root: Path

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None) -> "Workspace":
        ws = cls(resolve_workspace_path(path))
        ws.root.mkdir(parents=True, exist_ok=True)
        for sub in (ws.problems_dir, ws.archive_dir, ws.heldout_dir):
            sub.mkdir(parents=True, exist_ok=True)
        return ws

    @property
    def db_path(self) -> Path:
        return self.root / "workspace.db"

    @property
    def problems_dir(self) -> Path:
        return self.root / "problems"

    @property
    def heldout_dir(self) -> Path:
        """Explicit held-out workloads of imported problems: never in ``problems_dir``, whose
        folders candidates may read."""
        return self.root / "heldout"

    @property
    def archive_dir(self) -> Path:
        return self.root / "archive"

    @property
    def secret_path(self) -> Path:
        return self.root / "secret.key"

    @property
    def config_path(self) -> Path:
        return self.root / "config.json"

    def config(self, **overrides: Any) -> GuardConfig:
        return GuardConfig.load(self.config_path, **overrides)

    def problems(self) -> ProblemStore:
        return ProblemStore(self.problems_dir, heldout_dir=self.heldout_dir)

    @property
    def secret(self) -> bytes:
        """32 random bytes made on first use, readable by the owner only."""
        path = self.secret_path
        if not path.exists():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another process made it first
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(32))
        for _ in range(100):  # the other process may still be writing it
            text = path.read_text().strip()
            if len(text) == 64:
                return bytes.fromhex(text)
            time.sleep(0.01)
        raise RuntimeError(f"{path} is not a 64-digit hex key")
