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
from . import blobs
from .sol_import import copy_blobs, heldout_only_blobs, import_sol_folder, is_sol_folder, visible_blob_keys

log = logging.getLogger(__name__)

# what a problem's files were when it was parsed: (name, mtime in ns, size) each
_Stamp = tuple[tuple[str, int | None, int | None], ...]


class ProblemStore:
    """The seeds and a workspace's problems. A workspace problem's held-out workloads are kept
    in ``heldout_dir`` (``<name>.jsonl``), outside the problem folders: candidates may read
    those (their data files), and a candidate read the held-out workloads there and printed
    them in its diagnostic (red team, session 39). A ``heldout.jsonl`` found in a workspace
    problem's folder (written by an earlier version) is moved there when the problem is read."""

    def __init__(self, workspace_problems: Path, seeds_dir: Path = SEEDS_DIR, heldout_dir: Path | None = None):
        self.workspace_problems = workspace_problems
        self.seeds_dir = seeds_dir
        self.heldout_dir = heldout_dir
        self._cache: dict[Path, tuple[_Stamp, Problem, float]] = {}

    def heldout_file(self, name: str) -> Path | None:
        """Where a workspace problem's held-out workloads are kept (None: in its folder)."""
        return None if self.heldout_dir is None else self.heldout_dir / f"{name}.jsonl"

    def _load(self, folder: Path, origin: str) -> Problem:
        """A problem, parsed once and again only when its files change (checked at most
        once a second)."""
        now = time.monotonic()
        hit = self._cache.get(folder)
        if hit is not None and now - hit[2] < 1.0:
            return hit[1]
        heldout = self._heldout_of(folder) if origin == "workspace" else None
        files: list[tuple[str, int | None, int | None]] = []
        for path in (folder / DEFINITION_FILE, folder / WORKLOAD_FILE, heldout or folder / HELDOUT_FILE):
            try:
                st = path.stat()
                files.append((str(path), st.st_mtime_ns, st.st_size))
            except FileNotFoundError:
                files.append((str(path), None, None))
        stamp = tuple(files)
        if hit is not None and hit[0] == stamp:
            self._cache[folder] = (stamp, hit[1], now)
            return hit[1]
        problem = load_problem(folder, origin, heldout)
        if origin == "workspace":
            self._withhold_heldout_blobs(problem, folder)
        self._cache[folder] = (stamp, problem, now)
        return problem

    def _heldout_of(self, folder: Path) -> Path | None:
        """The held-out file of a workspace problem, moved out of its folder where an earlier
        version left it there."""
        target = self.heldout_file(folder.name)
        if target is None:
            return None
        inside = folder / HELDOUT_FILE
        if inside.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():  # both: the folder's is the stale one; kept aside, not shown
                inside.replace(target.with_name(f"{target.stem}.moved-{time.time_ns()}.jsonl"))
            else:
                inside.replace(target)
            log.info("moved the held-out workloads of %s out of its folder, to %s", folder.name, target)
        return target

    def _withhold_heldout_blobs(self, problem: Problem, folder: Path) -> None:
        """Hold the problem's folder to what ``copy_blobs`` now leaves there, where an earlier
        version copied more: a file only held-out workloads name is moved to the workspace's
        held-out folder; so is a file that also holds tensors no visible workload names, with
        a copy of the visible ones alone written in its place."""
        heldout_dir = self.heldout_dir
        if heldout_dir is None:
            return

        def move_out(rel: str) -> Path:
            target = heldout_dir / folder.name / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).replace(target)
            return target

        def plain_file(rel: str) -> bool:
            return (folder / rel).is_file() and not (folder / rel).is_symlink()

        for rel in filter(plain_file, heldout_only_blobs(problem)):
            move_out(rel)
            log.info("moved %s, named by held-out workloads only, out of %s", rel, folder)
        for rel, keys in visible_blob_keys(problem).items():
            if not plain_file(rel):
                continue
            try:
                extra = blobs.tensor_keys(folder / rel) - keys
            except (OSError, blobs.BlobError):
                continue
            if extra:  # also tensors no visible workload names: those go, the rest stays
                blobs.write_subset(move_out(rel), folder / rel, keys)
                log.info("%s of %s now holds only the tensors visible workloads name", rel, folder)

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
        heldout_file = self.heldout_file(problem.name)
        if heldout_file is not None:
            heldout_file.unlink(missing_ok=True)  # the replaced problem's
        problem.save(target, heldout_file)
        self._cache.pop(target, None)  # a replaced problem is read anew, not within the second
        if path.is_dir():
            withheld = copy_blobs(path, problem, target)
            if withheld:
                notes.append(
                    f"{len(withheld)} safetensors file(s) named by held-out workloads only (e.g. {withheld[0]}) "
                    "are not copied into the problem's folder, which candidates may read: those inputs are "
                    "judged with random values"
                )
        problem.origin = "workspace"
        return problem, notes
