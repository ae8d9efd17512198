"""What the command groups share: the JSON line, the workspace, the ``--device`` option and
the end of a swarm run. Human output goes to stdout, logs and progress to stderr; with
``--json`` the last line of stdout is one JSON object."""

from __future__ import annotations

import argparse
import json
import sys

from . import render


def emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


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
    if as_json:
        emit_json({"run": run_id, "report": str(report), "leaderboard": rows})
        return 0
    print(f"\nrun {run_id} finished; report: {report}")
    render.table(
        ["rank", "agent", "attempts", "accepted", "best", "SOL score", "x eager"],
        [
            [i + 1, r["agent"], r["attempts"], r["accepted"], r["best"], r["score"], r["speedup_eager"]]
            for i, r in enumerate(rows)
        ],
    )
    return 0
