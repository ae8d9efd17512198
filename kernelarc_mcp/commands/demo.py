"""``kernelarc demo``: the main job with nothing to configure. A three-agent scripted swarm
on a shipped seed problem, on the GPU if there is one and otherwise on the CPU (Triton
through its interpreter, CPU-sized workloads), ending with the leaderboard and the report."""

from __future__ import annotations

import sys

from ..common import device_option, print_run_end

DEMO_PROBLEM = "rmsnorm_llama3_8b"
DEMO_STRATEGIES = ["tiling_autotune", "library_precision", "memory_fusion"]


def run_demo(args) -> int:
    from guard.runner.device import resolve
    from guard.workspace import Workspace
    from launcher.monitor import LiveView
    from launcher.swarm import Swarm

    ws = Workspace.open(args.workspace)
    device = resolve(args.device)
    out = sys.stderr
    print(f"KernelArc demo: three scripted agents on {DEMO_PROBLEM}, judged on {device.kind} ({device.name}).",
          file=out)
    if device.kind == "cpu":
        print("No GPU here: Triton runs in its interpreter on CPU-sized workloads, so the times show the "
              "system at work, not kernel speed.", file=out)
    swarm = Swarm(ws, DEMO_PROBLEM, 3, "scripted", strategies=DEMO_STRATEGIES, budget_minutes=8,
                  max_candidates=3, device=args.device, on_update=LiveView())
    report = swarm.run()
    rc = print_run_end(ws, swarm.config.run_id, report, args.json)
    if not args.json:
        print(f"\nNext: `kernelarc report {swarm.config.run_id}`, `kernelarc problems`, "
              "`kernelarc serve` (see README).")
    return rc


def add_parsers(sub) -> None:
    s = sub.add_parser("demo", help="the main job: a three-agent scripted swarm on a seed problem")
    device_option(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=run_demo)
