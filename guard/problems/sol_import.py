"""Import a SOL-ExecBench / FlashInfer-Trace problem folder."""

from __future__ import annotations

import logging
from pathlib import Path

from . import blobs, sol_fidelity
from .families import classify
from .problem import Problem, ProblemError, load_problem
from .schema import SafetensorsInput, Workload

log = logging.getLogger(__name__)


def is_sol_folder(path: Path) -> bool:
    return path.is_dir() and (path / "definition.json").is_file()


def import_sol_folder(path: Path) -> tuple[Problem, list[str]]:
    """Read a problem folder; returns the problem and notes worth telling the user."""
    path = Path(path)
    problem = load_problem(path, origin="workspace")
    notes: list[str] = []
    d = problem.definition
    if not problem.workloads:
        raise ProblemError(f"{path}: workload.jsonl is missing or empty")
    ka = d.kernelarc
    if ka.op_family is None:
        ka.op_family = classify(d.op_type, d.name, d.description)
    ka.source = {**ka.source, "format": "sol-execbench", "path": str(path.resolve())}
    missing = _missing_blobs(path, problem)
    if missing:
        notes.append(
            f"{len(missing)} safetensors input(s) are not present (e.g. {missing[0]}); "
            "the guard synthesizes them from the axes (index tensors follow the paged-KV "
            "convention: offsets from 0 to the index count, indices below the page count)"
        )
    notes += [
        f"not honoured as SOL-ExecBench does: {n.render()}"
        for n in sol_fidelity.problem_notes(problem, include_solution=False)
    ]
    return problem, notes


def copy_blobs(src: Path, problem: Problem, dest: Path) -> list[str]:
    """Copy into ``dest``, at their relative paths, the safetensors files the visible workloads
    name, each holding only the tensors they name; returns the files only held-out workloads
    name, which are not copied. ``dest`` is a folder candidates may read, and a file gives its
    tensors' shapes and values (red team, session 39: a held-out input's shape printed from a
    header; then from a file a visible and a held-out workload shared). Held-out inputs left
    out are judged with values drawn at random, as any stored input whose file is missing
    (``derive._stored_where_present``)."""
    for rel, keys in visible_blob_keys(problem).items():
        for base in (src, *src.parents):
            candidate = base / rel
            if candidate.is_file():
                blobs.write_subset(candidate, dest / rel, keys)
                break
    return heldout_only_blobs(problem)


def visible_blob_keys(problem: Problem) -> dict[str, set[str]]:
    """Each safetensors file the visible workloads name, with the tensors they name in it."""
    out: dict[str, set[str]] = {rel: set() for rel in _blob_paths(problem, problem.workloads)}
    for w in problem.workloads:
        for spec in w.inputs.values():
            if isinstance(spec, SafetensorsInput):
                out[spec.path].add(spec.tensor_key)
    return out


def heldout_only_blobs(problem: Problem) -> list[str]:
    """The safetensors files that held-out workloads name and visible ones do not."""
    visible = set(_blob_paths(problem, problem.workloads))
    return [rel for rel in _blob_paths(problem, problem.heldout) if rel not in visible]


def _blob_paths(problem: Problem, workloads: list[Workload] | None = None) -> list[str]:
    paths = []
    for w in problem.workloads + problem.heldout if workloads is None else workloads:
        for spec in w.inputs.values():
            if isinstance(spec, SafetensorsInput) and spec.path not in paths:
                if Path(spec.path).is_absolute() or ".." in Path(spec.path).parts:
                    raise ProblemError(f"safetensors path {spec.path!r} must be relative")
                paths.append(spec.path)
    return paths


def _missing_blobs(src: Path, problem: Problem) -> list[str]:
    return [rel for rel in _blob_paths(problem) if not any((base / rel).is_file() for base in (src, *src.parents))]
