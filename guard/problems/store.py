"""Where problems live: the shipped seeds plus those imported into a workspace."""

from __future__ import annotations

import builtins
import logging
import shutil
import time
from pathlib import Path

from seeds import SEEDS_DIR

from .kernelbench_import import import_kernelbench_file, is_kernelbench_file
from .problem import DEFINITION_FILE, HELDOUT_FILE, WORKLOAD_FILE, Problem, ProblemError, load_problem
from .schema import check_name
from .sol_import import copy_blobs, import_sol_folder, is_sol_folder

log = logging.getLogger(__name__)

# what a problem's files were when it was parsed: (name, mtime in ns, size) each
_Stamp = tuple[tuple[str, int | None, int | None], ...]


class ProblemStore:
    def __init__(self, workspace_problems: Path, seeds_dir: Path = SEEDS_DIR):
        self.workspace_problems = workspace_problems
        self.seeds_dir = seeds_dir
        self._cache: dict[Path, tuple[_Stamp, Problem, float]] = {}

    def _load(self, folder: Path, origin: str) -> Problem:
        """A problem, parsed once and again only when its files change (checked at most
        once a second)."""
        now = time.monotonic()
        hit = self._cache.get(folder)
        if hit is not None and now - hit[2] < 1.0:
            return hit[1]
        files: list[tuple[str, int | None, int | None]] = []
        for name in (DEFINITION_FILE, WORKLOAD_FILE, HELDOUT_FILE):
            try:
                st = (folder / name).stat()
                files.append((name, st.st_mtime_ns, st.st_size))
            except FileNotFoundError:
                files.append((name, None, None))
        stamp = tuple(files)
        if hit is not None and hit[0] == stamp:
            self._cache[folder] = (stamp, hit[1], now)
            return hit[1]
        problem = load_problem(folder, origin)
        self._cache[folder] = (stamp, problem, now)
        return problem

    def _folders(self) -> list[tuple[Path, str]]:
        out = []
        for base, origin in ((self.seeds_dir, "seed"), (self.workspace_problems, "workspace")):
            if base.is_dir():
                out += [(p, origin) for p in sorted(base.iterdir()) if p.is_dir() and (p / "definition.json").is_file()]
        return out

    def names(self) -> list[str]:
        return [p.name for p, _ in self._folders()]

    def list(self) -> list[Problem]:
        problems = []
        for folder, origin in self._folders():
            try:
                problems.append(self._load(folder, origin))
            except ProblemError as exc:
                log.warning("skipping unreadable problem: %s", exc)
        return problems

    def get(self, name: str) -> Problem:
        check_name(name, "problem name")
        for base, origin in ((self.workspace_problems, "workspace"), (self.seeds_dir, "seed")):
            folder = base / name
            if (folder / "definition.json").is_file():
                return self._load(folder, origin)
        known = ", ".join(self.names()) or "none"
        raise ProblemError(f"no problem named {name!r} (known: {known})")

    def import_path(
        self, path: Path, name: str | None = None, replace: bool = False
    ) -> tuple[Problem, builtins.list[str]]:
        """Import a SOL-ExecBench folder or a KernelBench file; returns (problem, notes)."""
        path = Path(path)
        if not path.exists():
            raise ProblemError(f"{path}: no such file or folder")
        if is_sol_folder(path):
            problem, notes = import_sol_folder(path)
        elif is_kernelbench_file(path):
            problem, notes = import_kernelbench_file(path)
        else:
            raise ProblemError(
                f"{path}: not a SOL-ExecBench folder (definition.json + workload.jsonl) "
                "nor a KernelBench file (class Model, get_inputs, get_init_inputs)"
            )
        if name:
            problem.definition.name = check_name(name, "problem name")
        target = self.workspace_problems / problem.name
        if (self.seeds_dir / problem.name).exists():
            raise ProblemError(f"{problem.name!r} is the name of a shipped problem; import it with --name")
        if target.exists():
            if not replace:
                raise ProblemError(f"{problem.name!r} is already imported (use --replace)")
            shutil.rmtree(target)
        problem.save(target)
        if path.is_dir():
            copy_blobs(path, problem, target)
        problem.origin = "workspace"
        return problem, notes
