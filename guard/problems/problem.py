"""A problem on disk: its definition, visible workloads and optional explicit held-out ones."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from .schema import Definition, Workload

DEFINITION_FILE = "definition.json"
WORKLOAD_FILE = "workload.jsonl"
HELDOUT_FILE = "heldout.jsonl"  # never shown to agents
SEED_PREFIX = "seed_"  # seed kernels: seed_triton.py, seed_cuda.cu, ...


class ProblemError(ValueError):
    """A problem folder that cannot be read; the message says which file and why."""


@dataclass
class Problem:
    definition: Definition
    workloads: list[Workload]
    heldout: list[Workload] = field(default_factory=list)
    root: Path | None = None
    origin: str = "workspace"  # "seed" or "workspace"

    @property
    def name(self) -> str:
        return self.definition.name

    def seed_kernels(self) -> dict[str, Path]:
        """Seed kernels shipped beside the problem, by file name."""
        if self.root is None:
            return {}
        return {p.name: p for p in sorted(self.root.iterdir()) if p.is_file() and p.name.startswith(SEED_PREFIX)}

    def save(self, folder: Path, heldout_file: Path | None = None) -> None:
        """Write the problem into ``folder``; its held-out workloads, if any, to
        ``heldout_file`` (by default ``folder``'s ``heldout.jsonl``): a workspace keeps them
        out of the problem folder, which candidates may read (``ProblemStore``)."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / DEFINITION_FILE).write_text(json.dumps(self.definition.to_json(), indent=2) + "\n")
        write_jsonl(folder / WORKLOAD_FILE, self.workloads)
        if self.heldout:
            target = heldout_file or folder / HELDOUT_FILE
            target.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl(target, self.heldout)
        self.root = folder


def write_jsonl(path: Path, workloads: list[Workload]) -> None:
    lines = [json.dumps(w.model_dump(mode="json", exclude_none=True)) for w in workloads]
    path.write_text("\n".join(lines) + "\n")


def read_jsonl(path: Path) -> list[Workload]:
    out: list[Workload] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Workload.model_validate_json(line))
        except ValidationError as exc:
            raise ProblemError(f"{path}:{lineno}: {_first_error(exc)}") from None
    return out


def load_problem(folder: Path, origin: str = "workspace", heldout_file: Path | None = None) -> Problem:
    """The problem in ``folder``; its held-out workloads from ``heldout_file`` (by default the
    folder's ``heldout.jsonl``)."""
    folder = Path(folder)
    dpath = folder / DEFINITION_FILE
    if not dpath.is_file():
        raise ProblemError(f"{folder}: no {DEFINITION_FILE}")
    try:
        definition = Definition.model_validate_json(dpath.read_text())
    except ValidationError as exc:
        raise ProblemError(f"{dpath}: {_first_error(exc)}") from None
    wpath = folder / WORKLOAD_FILE
    workloads = read_jsonl(wpath) if wpath.is_file() else []
    hpath = heldout_file or folder / HELDOUT_FILE
    heldout = read_jsonl(hpath) if hpath.is_file() else []
    for w in workloads + heldout:
        try:
            definition.resolve_axes(w.axes)
        except ValueError as exc:
            raise ProblemError(f"{folder}: workload {w.uuid}: {exc}") from None
        missing = set(definition.inputs) - set(w.inputs)
        if missing:
            raise ProblemError(f"{folder}: workload {w.uuid} lacks inputs {sorted(missing)}")
    return Problem(definition, workloads, heldout, folder, origin)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg"))
