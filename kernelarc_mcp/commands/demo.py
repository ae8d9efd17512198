"""``kernelarc demo``: the main job with nothing to configure. A three-agent scripted swarm
on a shipped seed problem, on the GPU if there is one and otherwise on the CPU (Triton
through its interpreter, CPU-sized workloads), ending with the leaderboard and the report.

The demo has a workspace of its own (``.kernelarc-demo`` unless ``--workspace`` names one),
so its results never mix with real ones. On the CPU that workspace is given a quick guard
profile on first use (``DEMO_CPU_PROFILE``): the same cascade and defences, with fewer timed
iterations and correctness rounds and no ``torch.compile`` baseline, whose CPU compilation
alone took minutes on a small machine."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..common import device_option, print_run_end

DEMO_PROBLEM = "rmsnorm_llama3_8b"
DEMO_STRATEGIES = ["tiling_autotune", "library_precision", "memory_fusion"]
DEMO_WORKSPACE = ".kernelarc-demo"
DEMO_BUDGET_MINUTES = 2.5
DEMO_CPU_PROFILE = {
    "compile_baseline": False,
    "min_iters": 10,
    "max_iters": 50,
    "target_time_s": 0.05,
    "warmup_time_s": 0.01,
    "correctness_rounds": 2,
    "heldout_rounds": 1,
    # CPU outside-clock windows of 15 ms, as the tests run them: since session 34 every call's
    # inputs of a window are drawn and written by the guard outside it, a cost that grows with
    # the window's calls (at 50 ms the demo ran 193 s, two attempts an agent)
    "outside_window_s_cpu": 0.015,
    # the two smallest CPU workloads of four: with four, the agents' verdicts and pairings
    # overran the budget in one run of three (193 s, three jobs left unjudged, session 35)
    "cpu_workloads": 2,
}


def demo_workspace(requested: str | None) -> Path:
    """``--workspace`` if given, else ``$KERNELARC_DEMO_WORKSPACE``, else ``.kernelarc-demo``."""
    return Path(requested or os.environ.get("KERNELARC_DEMO_WORKSPACE") or DEMO_WORKSPACE)


def ensure_cpu_profile(ws) -> bool:
    """Write the quick profile as the workspace's config.json unless it has one (a user's own
    settings win). True when written."""
    if ws.config_path.exists():
        return False
    ws.config_path.write_text(json.dumps(DEMO_CPU_PROFILE, indent=1) + "\n")
    return True


def run_demo(args) -> int:
    from guard.runner.device import resolve
    from guard.workspace import Workspace
    from launcher.monitor import LiveView
    from launcher.swarm import Swarm

    ws = Workspace.open(demo_workspace(args.workspace))
    device = resolve(args.device)
    out = sys.stderr
    print(
        f"KernelArc demo: three scripted agents on {DEMO_PROBLEM}, judged on {device.kind} ({device.name}), "
        f"{DEMO_BUDGET_MINUTES:g} minutes; workspace {ws.root}.",
        file=out,
    )
    if device.kind == "cpu":
        if ensure_cpu_profile(ws):
            print(
                f"Quick CPU profile written to {ws.config_path} (fewer timed iterations, no torch.compile baseline).",
                file=out,
            )
        print(
            "No GPU here: Triton runs in its interpreter on CPU-sized workloads, so the times show the "
            "system at work, not kernel speed.",
            file=out,
        )
    swarm = Swarm(
        ws,
        DEMO_PROBLEM,
        3,
        "scripted",
        strategies=DEMO_STRATEGIES,
        budget_minutes=DEMO_BUDGET_MINUTES,
        max_candidates=3,
        device=args.device,
        on_update=LiveView(),
    )
    report = swarm.run()
    rc = print_run_end(ws, swarm.config.run_id, report, args.json)
    judged = sum(r["attempts"] for r in json.loads((report.parent / "leaderboard.json").read_text()))
    if not judged:
        print(
            f"\nNo candidate was judged within the demo's {DEMO_BUDGET_MINUTES:g} minutes: the machine may be "
            f"too busy, or the server failed (see {swarm.folder.root / 'server.log'}).",
            file=out,
        )
        return 1
    if not args.json:
        plot = report.parent / "score_over_time.png"
        print(f"\nReport: {report}" + (f"\nPlot:   {plot}" if plot.exists() else ""))
        print(
            f"Next: `kernelarc --workspace {ws.root} report {swarm.config.run_id}`, "
            f"`kernelarc --workspace {ws.root} leaderboard --problem {DEMO_PROBLEM}` (see README)."
        )
    return rc


def add_parsers(sub) -> None:
    s = sub.add_parser("demo", help="the main job: a three-agent scripted swarm on a seed problem")
    device_option(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=run_demo)
