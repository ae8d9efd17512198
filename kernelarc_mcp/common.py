"""What the command groups share: the JSON line, the end of a listing (JSON, a line saying
there is nothing, or a table), the workspace, the ``--device`` option and the end of a swarm
run. Human output goes to stdout, logs and progress to stderr; with
``--json`` the last line of stdout is one JSON object."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from . import render


def emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def print_listing(
    as_json: bool, payload: object, headers: list[str], rows: Iterable[list[Any]], empty: str = ""
) -> int:
    """How a listing command ends: with ``--json`` the JSON line ``payload``; else the table of
    ``rows`` (read only then), or the line ``empty`` instead when there are none and it is given."""
    if as_json:
        emit_json(payload)
        return 0
    cells = list(rows)
    if not cells and empty:
        print(empty)
        return 0
    render.table(headers, cells)
    return 0


def open_workspace(args):
    from guard.workspace import Workspace

    return Workspace.open(args.workspace)


def device_option(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="where to evaluate (auto: the GPU if NVML sees one, else the CPU)",
    )


def print_run_end(ws, run_id: str, report, as_json: bool) -> int:
    rows = json.loads((report.parent / "leaderboard.json").read_text())
    if not as_json:
        print(f"\nrun {run_id} finished; report: {report}")
    return print_listing(
        as_json,
        {"run": run_id, "report": str(report), "leaderboard": rows},
        ["rank", "agent", "attempts", "accepted", "best", "SOL score", "x eager"],
        (
            [i + 1, r["agent"], r["attempts"], r["accepted"], r["best"], r["score"], r["speedup_eager"]]
            for i, r in enumerate(rows)
        ),
    )
