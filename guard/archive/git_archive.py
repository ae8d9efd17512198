"""Accepted candidates committed to a git repository inside the workspace (gitpython)."""

from __future__ import annotations

import fcntl
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import git

from ..candidates.solution import check_source_path

log = logging.getLogger(__name__)


class GitArchive:
    def __init__(self, path: Path):
        self.path = Path(path)

    def _repo(self) -> git.Repo:
        import git  # gitpython; imported lazily, it starts no process until used

        self.path.mkdir(parents=True, exist_ok=True)
        if (self.path / ".git").is_dir():
            return git.Repo(self.path)
        repo = git.Repo.init(self.path)
        with repo.config_writer() as cw:
            cw.set_value("user", "name", "KernelArc guard")
            cw.set_value("user", "email", "guard@kernelarc.invalid")
        (self.path / "README.md").write_text(
            "Accepted candidates, one folder per problem/agent/candidate, committed by the guard.\n"
        )
        repo.index.add(["README.md"])
        repo.index.commit("archive created", skip_hooks=True)
        return repo

    def commit(
        self, problem: str, agent: str, candidate_id: str, solution: dict[str, Any], summary: dict[str, Any]
    ) -> str | None:
        """Write the candidate's sources (under ``sources/``, at their own paths, each checked
        again) and, beside them, its solution and verdict summary, and commit them; returns
        the sha. Sources once lay beside the guard's own files: a source ``verdict.json`` was
        overwritten by the summary, and one ``verdict.json/n.txt`` kept an ACCEPT out of the
        archive (red team, session 42)."""
        lock = open(self.path.parent / ".archive.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            repo = self._repo()
            folder = Path(problem) / _safe(agent) / candidate_id
            target = self.path / folder
            target.mkdir(parents=True, exist_ok=True)
            files = []
            for src in solution["sources"]:
                rel = Path("sources") / check_source_path(src["path"])
                p = target / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(src["content"])
                files.append(str(folder / rel))
            (target / "solution.json").write_text(json.dumps(solution, indent=2) + "\n")
            (target / "verdict.json").write_text(json.dumps(summary, indent=2) + "\n")
            files += [str(folder / "solution.json"), str(folder / "verdict.json")]
            repo.index.add(files)
            msg = (
                f"{problem}: {candidate_id} by {agent} {summary.get('decision')}"
                f" score={summary.get('score')} speedup={summary.get('speedup_eager')}"
                + (" (global best)" if summary.get("is_global_best") else "")
            )
            # no hook: a red team's agent set core.hooksPath in the user's git configuration,
            # and this process would have run it, unsandboxed, at every ACCEPT
            return repo.index.commit(msg, skip_hooks=True).hexsha
        except Exception as exc:  # the database holds the result either way
            log.error("git archive commit of %s failed (the database holds it): %s", candidate_id, exc)
            return None
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:64] or "agent"
