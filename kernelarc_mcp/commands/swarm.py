"""``kernelarc launch``, ``status``, ``stop`` and ``report``: swarm runs and what they left."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from ..common import device_option, open_workspace, print_listing, print_run_end

if TYPE_CHECKING:
    from launcher.limits import AgentLimits


def agent_limits(args) -> AgentLimits:
    """The ``--agent-*`` options as limits; ValueError naming the option where one is not valid."""
    from pydantic import ValidationError

    from launcher.limits import AgentLimits

    try:
        return AgentLimits(nice=args.agent_nice, memory_gb=args.agent_memory_gb, tasks=args.agent_tasks)
    except ValidationError as exc:
        bad = exc.errors()[0]
        raise ValueError(f"--agent-{str(bad['loc'][0]).replace('_', '-')}: {bad['msg']}") from None


def cmd_launch(args) -> int:
    from guard.runner.device import parse_count
    from launcher.monitor import LiveView
    from launcher.swarm import Swarm

    parse_count(args.devices)  # a clear error now, not from the server the launcher starts
    limits = agent_limits(args)
    ws = open_workspace(args)
    swarm = Swarm(
        ws,
        args.problem,
        args.agents,
        args.client,
        strategies=args.strategies,
        model=args.model,
        budget_minutes=args.budget_minutes,
        max_candidates=args.max_candidates,
        device=args.device,
        devices=args.devices,
        server_url=args.server,
        agent_limits=limits,
        on_update=None if args.quiet else LiveView(),
    )
    print(
        f"run {swarm.config.run_id}: {args.agents} {args.client} agent(s) on {args.problem}; "
        f"folder {swarm.folder.root}",
        file=sys.stderr,
    )
    report = swarm.run()
    return print_run_end(ws, swarm.config.run_id, report, args.json)


def cmd_status(args) -> int:
    from guard.archive.db import Database
    from launcher.run import RunFolder

    ws = open_workspace(args)
    db = Database(ws.db_path)
    out = []
    for folder in RunFolder.all(ws.root):
        run = folder.load()
        names = [a["name"] for a in run["agents"]]
        marks = ",".join("?" for _ in names) or "''"
        n = db.query(f"SELECT COUNT(*) AS n FROM candidates WHERE agent IN ({marks})", tuple(names))[0]["n"]
        live = run.get("state") == "running" and _pid_alive(run.get("launcher_pid"))
        out.append(
            {
                "run": folder.run_id,
                "problem": run["problem"],
                "client": run["client"],
                "agents": len(names),
                "state": "running" if live else run.get("state", "?"),
                "candidates": n,
                "ended": run.get("ended_reason"),
            }
        )
    return print_listing(
        args.json,
        {"runs": out},
        ["run", "problem", "client", "agents", "state", "candidates", "ended"],
        ([r["run"], r["problem"], r["client"], r["agents"], r["state"], r["candidates"], r["ended"]] for r in out),
        empty="no runs in this workspace",
    )


def _pid_alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def cmd_stop(args) -> int:
    from launcher.run import RunFolder

    ws = open_workspace(args)
    runs = RunFolder.all(ws.root)
    if args.run:
        runs = [r for r in runs if r.run_id == args.run]
    live = [r for r in runs if r.load().get("state") == "running" and _pid_alive(r.load().get("launcher_pid"))]
    if not live:
        print("kernelarc: no running swarm" + (f" named {args.run}" if args.run else ""), file=sys.stderr)
        return 2
    for r in live:
        r.stop_file.write_text("stop requested\n")
        print(f"asked run {r.run_id} to stop (its launcher ends the agents within a few seconds)")
    return 0


def cmd_report(args) -> int:
    from launcher.report import build_report
    from launcher.run import RunFolder

    ws = open_workspace(args)
    runs = [r.run_id for r in RunFolder.all(ws.root)]
    if args.run not in runs:
        print(f"kernelarc: no run {args.run!r} (runs: {', '.join(runs) or 'none'})", file=sys.stderr)
        return 2
    report = build_report(ws.root, args.run)
    return print_run_end(ws, args.run, report, args.json)


def add_parsers(sub) -> None:
    s = sub.add_parser("launch", help="start a swarm of agents on one problem")
    s.add_argument("--problem", required=True)
    s.add_argument("--agents", type=int, default=3)
    s.add_argument("--client", choices=["claude", "codex", "scripted"], default="scripted")
    s.add_argument("--strategies", nargs="+", help="strategy names, assigned in turn (default: all, round-robin)")
    s.add_argument("--model", help="model for the claude/codex clients")
    s.add_argument("--budget-minutes", type=float, default=30.0)
    s.add_argument("--max-candidates", type=int, help="per agent")
    device_option(s)
    s.add_argument(
        "--devices",
        default="1",
        help="GPUs of this host that judge, for the server the launcher starts: N or 'all' (default 1)",
    )
    s.add_argument("--server", help="URL of a running server (same workspace); default: start one")
    s.add_argument(
        "--agent-nice",
        type=int,
        default=19,
        help="the nice value agents' processes run at, below the guard's timed workers (0-19; default 19)",
    )
    s.add_argument(
        "--agent-memory-gb",
        type=float,
        help="memory each agent's processes may hold together (default: not capped)",
    )
    s.add_argument(
        "--agent-tasks",
        type=int,
        help="processes and threads each agent may hold together, at least 64 (default: a guard worker's cap)",
    )
    s.add_argument("--json", action="store_true")
    s.add_argument("-q", "--quiet", action="store_true", help="no live view on stderr")
    s.set_defaults(fn=cmd_launch)

    s = sub.add_parser("status", help="swarm runs in this workspace")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("stop", help="stop a running swarm (the newest, or RUN)")
    s.add_argument("run", nargs="?")
    s.set_defaults(fn=cmd_stop)

    s = sub.add_parser("report", help="a run's report: leaderboard, score plot, best kernel")
    s.add_argument("run")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_report)
