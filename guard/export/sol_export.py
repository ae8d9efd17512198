"""Write a problem's judged candidates as a SOL-ExecBench folder: ``definition.json`` and
``workload.jsonl`` (the visible workloads only; held-out ones stay secret), one
``solutions/<candidate>.json`` per candidate in the published solution schema, and
``traces.jsonl`` with one trace per candidate and workload."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from ..archive.db import Database
from ..problems.derive import CPU_WORKLOAD_COUNT
from ..problems.problem import DEFINITION_FILE, WORKLOAD_FILE, Problem, write_jsonl
from ..verdict import Verdict
from . import sol_trace as T
from .sol_solution import SolSolution, export_solution
from .traces import ExportError, candidate_traces, stored_solution

log = logging.getLogger(__name__)

TRACES_FILE = "traces.jsonl"
SOLUTIONS_DIR = "solutions"


class ExportSummary(BaseModel):
    problem: str
    folder: str
    candidates: int = 0
    traces: int = 0
    by_status: dict[str, int] = Field(default_factory=dict)
    skipped: list[str] = Field(default_factory=list)  # "<candidate>: why"


def candidate_export(
    db: Database, problem: Problem, cid: str, cpu_count: int = CPU_WORKLOAD_COUNT
) -> tuple[SolSolution, list[T.Trace]]:
    """The published solution and the traces of one judged candidate (``cpu_count``: the CPU
    workloads its workspace judges, ``GuardConfig.cpu_workloads``)."""
    row = db.candidate(cid)
    if row is None:
        raise ExportError(f"no candidate {cid!r}")
    if row["problem"] != problem.name:
        raise ExportError(f"candidate {cid} is of problem {row['problem']}, not {problem.name}")
    if row["state"] != "done" or not row["verdict_json"]:
        raise ExportError(f"candidate {cid} has no verdict yet (state {row['state']})")
    verdict = Verdict.model_validate_json(row["verdict_json"])
    try:
        solution = export_solution(stored_solution(row["solution_json"]), cid, problem.name, row["agent"])
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ExportError(
            f"candidate {cid} does not fit SOL-ExecBench's solution schema: "
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
        ) from None
    return solution, candidate_traces(verdict, problem, cid, row["finished_at"] or row["created_at"], cpu_count)


def export_problem(
    db: Database, problem: Problem, folder: Path, agent: str | None = None, cpu_count: int = CPU_WORKLOAD_COUNT
) -> ExportSummary:
    folder = Path(folder)
    (folder / SOLUTIONS_DIR).mkdir(parents=True, exist_ok=True)
    (folder / DEFINITION_FILE).write_text(json.dumps(problem.definition.to_json(), indent=2) + "\n")
    write_jsonl(folder / WORKLOAD_FILE, problem.workloads)
    summary = ExportSummary(problem=problem.name, folder=str(folder))
    lines = []
    rows = [
        r
        for r in reversed(db.candidates_for(problem.name, limit=100_000))
        if r["state"] == "done" and (agent is None or r["agent"] == agent)
    ]
    for row in rows:
        try:
            solution, traces = candidate_export(db, problem, row["id"], cpu_count)
        except ExportError as exc:
            summary.skipped.append(str(exc))
            log.warning("%s", exc)
            continue
        (folder / SOLUTIONS_DIR / f"{row['id']}.json").write_text(solution.model_dump_json(indent=2) + "\n")
        summary.candidates += 1
        for t in traces:
            lines.append(t.to_line())
            status = t.evaluation.status if t.evaluation else "NONE"
            summary.by_status[status] = summary.by_status.get(status, 0) + 1
    (folder / TRACES_FILE).write_text("".join(line + "\n" for line in lines))
    summary.traces = len(lines)
    return summary
