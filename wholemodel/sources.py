"""Where the kernels ``kernelarc verify`` plugs in come from.

--run RUN          the best accepted kernel of a swarm run (on the run's problem)
--candidate ID     a candidate the guard judged, by id
--kernel P=FILE    a kernel file for problem P (judged or not: verify checks the model)
--seeds            the seed kernels of each family, on problems for this model's shapes
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from guard.archive.db import Database
from guard.candidates.load import from_file
from guard.candidates.solution import Solution
from guard.problems.problem import Problem
from guard.workspace import Workspace
from seeds import SEEDS_DIR

from .problems import build_problem, plan
from .profile import Profile
from .sites import BY_FAMILY


@dataclass
class KernelSource:
    problem: Problem
    solution: Solution
    origin: str  # shown in tables: "run R, candidate C", "file F", "seed ..."


def _accepted(db: Database, cid: str) -> dict:
    row = db.candidate(cid)
    if row is None:
        raise ValueError(f"no candidate {cid!r} in this workspace")
    return dict(row)


def from_candidate(ws: Workspace, cid: str) -> KernelSource:
    db = Database(ws.db_path)
    row = _accepted(db, cid)
    if row["decision"] != "ACCEPT":
        raise ValueError(
            f"candidate {cid} was not accepted ({row['decision'] or row['state']}); "
            "plug a file with --kernel PROBLEM=FILE to try it anyway"
        )
    return KernelSource(
        ws.problems().get(row["problem"]),
        Solution.model_validate(json.loads(row["solution_json"])),
        f"candidate {cid} by {row['agent']}",
    )


def from_run(ws: Workspace, run_id: str) -> KernelSource:
    from launcher.report import best_of_run

    best = best_of_run(ws.root, run_id)
    if best is None:
        raise ValueError(f"run {run_id} has no accepted kernel")
    src = from_candidate(ws, best["id"])
    src.origin = f"run {run_id}, {src.origin}"
    return src


def from_kernel_file(ws: Workspace, spec: str) -> KernelSource:
    problem, sep, path = spec.partition("=")
    if not sep or not problem or not path:
        raise ValueError(f"--kernel {spec!r}: expected PROBLEM=FILE")
    return KernelSource(ws.problems().get(problem), from_file(Path(path)), f"file {path}")


def seed_sources(profile: Profile, language: str = "triton") -> list[KernelSource]:
    """The seed kernel of every family this model has a site for, each on a problem with
    this model's shapes (built in memory, as ``profile --top`` would write it)."""
    planned, _ = plan(profile, top=len(profile.entries))
    suffix = {"triton": "seed_triton.py", "cuda": "seed_cuda.cu"}[language]
    out, seen = [], {}
    for p in planned:
        seen[p.family] = seen.get(p.family, 0) + 1
        name = f"{profile.model}_{p.family}" + (f"_{seen[p.family]}" if seen[p.family] > 1 else "")
        problem = build_problem(p, profile, name)
        path = SEEDS_DIR / BY_FAMILY[p.family].template / suffix
        out.append(KernelSource(problem, from_file(path), f"seed {path.parent.name}/{path.name}"))
    return out
