"""``kernelarc export`` and ``kernelarc show ID --trace``: SOL-ExecBench traces and solutions
out of the workspace (a thin layer over ``guard.export``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..common import open_workspace


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def show_trace(args) -> int:
    """Print one candidate's traces as SOL-ExecBench trace JSONL (one line per workload)."""
    from guard.archive.db import Database
    from guard.export.sol_export import candidate_export
    from guard.export.traces import ExportError

    ws = open_workspace(args)
    db = Database(ws.db_path)
    row = db.candidate(args.candidate)
    if row is None:
        print(f"no candidate {args.candidate!r}", file=sys.stderr)
        return 2
    try:
        _, traces = candidate_export(db, ws.problems().get(row["problem"]), args.candidate, ws.config().cpu_workloads)
    except ExportError as exc:
        print(f"kernelarc: {exc}", file=sys.stderr)
        return 2
    for t in traces:
        _out(t.to_line())
    return 0


def cmd_export(args) -> int:
    from guard.archive.db import Database
    from guard.export.sol_export import export_problem

    ws = open_workspace(args)
    problem = ws.problems().get(args.problem)
    folder = Path(args.out or f"{args.problem}-sol-execbench")
    summary = export_problem(
        Database(ws.db_path), problem, folder, agent=args.agent, cpu_count=ws.config().cpu_workloads
    )
    if args.json:
        _out(json.dumps(summary.model_dump()))
        return 0
    _out(f"wrote {summary.candidates} solutions and {summary.traces} traces of {summary.problem} to {folder}")
    for status, n in sorted(summary.by_status.items()):
        _out(f"  {status}: {n}")
    for why in summary.skipped:
        _out(f"  skipped: {why}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("export", help="write a problem's candidates as SOL-ExecBench solutions and traces")
    s.add_argument("--problem", required=True)
    s.add_argument("--format", choices=["sol-execbench"], default="sol-execbench")
    s.add_argument("--out", help="folder to write (default ./PROBLEM-sol-execbench)")
    s.add_argument("--agent", help="only this agent's candidates")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.set_defaults(fn=cmd_export)
