"""The ``kernelarc`` command line. Every command is a thin layer over the library (guard/),
the same one the MCP server and the tests use. Human output goes to stdout, logs and
progress to stderr; with ``--json`` the last line of stdout is one JSON object."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import __version__, render

log = logging.getLogger("kernelarc")


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * min(verbosity, 2)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


def _emit_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def _workspace(args):
    from guard.workspace import Workspace

    return Workspace.open(args.workspace)


# -- commands ----------------------------------------------------------------------------


def cmd_import(args) -> int:
    from guard.problems.summary import summarize

    ws = _workspace(args)
    problem, notes = ws.problems().import_path(Path(args.path), name=args.name, replace=args.replace)
    if args.json:
        _emit_json({"imported": problem.name, "notes": notes, "summary": summarize(problem)})
    else:
        print(f"imported {problem.name} into {ws.problems_dir / problem.name}")
        for n in notes:
            print(f"  note: {n}")
    return 0


def cmd_problems(args) -> int:
    from guard.problems.summary import human_bytes, summarize

    ws = _workspace(args)
    summaries = [summarize(p) for p in ws.problems().list()]
    if args.json:
        _emit_json({"problems": summaries})
        return 0
    render.table(
        ["problem", "origin", "family", "workloads", "dtypes", "largest I/O", "max GFLOP", "seeds"],
        [
            [s["name"][:60], s["origin"], s["op_family"], s["workloads"], ",".join(s["dtypes"]),
             human_bytes(s["max_io_bytes"]), (s["max_flops"] / 1e9) if s["max_flops"] else None,
             len(s["seed_kernels"])]
            for s in summaries
        ],
    )
    return 0


def _guard(args, ws):
    from guard.cascade import Guard

    overrides = {}
    if getattr(args, "no_compile_baseline", False):
        overrides["compile_baseline"] = False
    guard = Guard(ws, ws.config(**overrides), device=args.device)
    guard.warm_up()
    return guard


def cmd_submit(args) -> int:
    from guard.candidates.load import from_file

    ws = _workspace(args)
    solution = from_file(Path(args.file), language=args.language)
    progress = render.ProgressLine(enabled=not args.quiet)
    with _guard(args, ws) as guard:
        try:
            verdict = guard.evaluate(
                solution, args.problem, agent=args.agent, notes=args.notes, parent=args.parent,
                progress=progress,
            )
        finally:
            progress.finish()
    if args.json:
        _emit_json(verdict.model_dump(mode="json"))
    else:
        render.verdict(verdict)
    return 0


def cmd_leaderboard(args) -> int:
    from guard.archive.db import Database
    from guard.leaderboard import leaderboard

    ws = _workspace(args)
    ws.problems().get(args.problem)  # a clear error for an unknown name
    board = leaderboard(Database(ws.db_path), args.problem)
    if args.json:
        _emit_json(board)
        return 0
    if not board["agents"]:
        print(f"no accepted candidate for {args.problem} yet ({board['candidates']} submitted)")
        return 0
    render.table(
        ["rank", "agent", "candidate", "lang", "SOL score", "x eager", "x compile", "SOL frac", "latency", "attempts", ""],
        [
            [i + 1, e["agent"], e["candidate_id"], e["language"], e["score"], e["speedup_eager"],
             e["speedup_compile"], e["sol_fraction"], render.ms(e["latency_ms"]), e["attempts"],
             "global best" if e["is_global_best"] else ""]
            for i, e in enumerate(board["agents"])
        ],
    )
    return 0


def cmd_show(args) -> int:
    from guard.archive.db import Database
    from guard.leaderboard import candidate_detail

    if args.trace:  # SOL-ExecBench trace JSONL instead of the verdict
        from .export_commands import show_trace

        return show_trace(args)
    ws = _workspace(args)
    detail = candidate_detail(Database(ws.db_path), args.candidate)
    if detail is None:
        print(f"no candidate {args.candidate!r}", file=sys.stderr)
        return 2
    if args.json:
        _emit_json(detail)
        return 0
    from guard.verdict import Verdict

    if detail["verdict"]:
        render.verdict(Verdict.model_validate(detail["verdict"]))
    else:
        print(f"{detail['id']}: {detail['state']} {detail.get('reason') or ''}")
    if args.source:
        for src in detail["solution"]["sources"]:
            print(f"\n--- {src['path']}\n{src['content']}")
    return 0


def cmd_serve(args) -> int:
    import os

    from memory.conclusions import Retention

    from .http_app import check_port_free, serve_http
    from .server import build_server
    from .service import Service, ServiceError
    from .tokens import check_agent_name

    ws = _workspace(args)
    retention = Retention(args.retention_days, args.retention_per_problem)
    if args.transport == "http" and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: reachable beyond this machine", args.host)
    from guard.runner.device import parse_count

    if args.transport == "http":
        try:  # before the service re-queues interrupted jobs: a second server must change nothing
            check_port_free(args.host, args.port)
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", args.host, args.port, exc)
            return 3
    try:
        service = Service(ws, ws.config(), device=args.device, retention=retention, max_wait_s=args.max_wait,
                          devices=parse_count(args.devices), prepare=args.prepare or ())
    except ServiceError as exc:  # an unknown problem to prepare
        log.error("%s", exc)
        return 2
    if len(service.guards) > 1:
        log.info("judging on %d devices: %s", len(service.guards), ", ".join(g.device.key for g in service.guards))
    try:
        if args.transport == "http":
            if args.allow_anonymous:
                log.warning("anonymous HTTP allowed: every caller is agent 'anonymous'")
            options = {
                "workspace": str(ws.root), "device": args.device, "host": args.host, "port": args.port,
                "allow_anonymous": args.allow_anonymous, "max_wait": args.max_wait,
                "retention_days": args.retention_days, "retention_per_problem": args.retention_per_problem,
                "log_level": logging.getLogger().level,
            }
            log.info("serving MCP on http://%s:%d/mcp with %d worker(s)", args.host, args.port, args.workers)
            serve_http(service, options, args.workers)
        else:
            agent = args.agent or os.environ.get("KERNELARC_AGENT") or "stdio"
            mcp = build_server(service, http_auth=False, stdio_agent=check_agent_name(agent))
            mcp.run(transport="stdio")
    finally:
        service.close()
    return 0


def cmd_token(args) -> int:
    from guard.archive.db import Database

    from .tokens import TokenStore

    ws = _workspace(args)
    store = TokenStore(Database(ws.db_path))
    if args.action == "create":
        token = store.create(args.name, replace=args.replace)
        if args.json:
            _emit_json({"agent": args.name, "token": token})
        else:
            print(token)
            print(f"token for agent {args.name!r}: shown once; present it as 'Authorization: Bearer <token>'",
                  file=sys.stderr)
    elif args.action == "revoke":
        if not store.revoke(args.name):
            print(f"kernelarc: no token for {args.name!r}", file=sys.stderr)
            return 2
        print(f"revoked {args.name}")
    else:
        agents = store.agents()
        if args.json:
            _emit_json({"agents": agents})
        else:
            for a in agents:
                print(a["agent"])
    return 0


def cmd_memory(args) -> int:
    from guard.archive.db import Database
    from memory.conclusions import Retention
    from memory.store import Memory

    ws = _workspace(args)
    mem = Memory(Database(ws.db_path))
    if args.action == "list":
        rows = mem.listing(args.problem, args.limit)
    elif args.action == "search":
        if not args.query or not args.problem:
            print("kernelarc: memory search needs a QUERY and --problem", file=sys.stderr)
            return 2
        rows = mem.recall(ws.problems().get(args.problem), args.query, args.scope, args.limit)
    elif args.action == "prune":
        if args.days is None and args.per_problem is None:
            print("kernelarc: memory prune needs --days and/or --per-problem", file=sys.stderr)
            return 2
        n = mem.prune(Retention(args.days, args.per_problem), args.problem)
        if args.json:
            _emit_json({"pruned": n, "left": mem.count()})
        else:
            print(f"pruned {n} conclusion(s); {mem.count()} left")
        return 0
    else:  # export: JSON lines on stdout
        for row in mem.export(args.problem):
            sys.stdout.write(json.dumps(row) + "\n")
        return 0
    if args.json:
        _emit_json({"conclusions": rows})
        return 0
    if not rows:
        print("no conclusions")
        return 0
    render.table(
        ["id", "problem", "kind", "agent", "evidence", "strength", "support", "text"],
        [[r["id"], r["problem"][:28], r["kind"], r["agent"], r["evidence"], r["strength"], r["support"],
          r["text"][:70]] for r in rows],
    )
    return 0


def cmd_launch(args) -> int:
    from launcher.monitor import LiveView
    from launcher.swarm import Swarm

    from guard.runner.device import parse_count

    parse_count(args.devices)  # a clear error now, not from the server the launcher starts
    ws = _workspace(args)
    swarm = Swarm(
        ws, args.problem, args.agents, args.client, strategies=args.strategies, model=args.model,
        budget_minutes=args.budget_minutes, max_candidates=args.max_candidates, device=args.device,
        devices=args.devices, server_url=args.server, on_update=None if args.quiet else LiveView(),
    )
    print(f"run {swarm.config.run_id}: {args.agents} {args.client} agent(s) on {args.problem}; "
          f"folder {swarm.folder.root}", file=sys.stderr)
    report = swarm.run()
    return _print_run_end(ws, swarm.config.run_id, report, args.json)


def _print_run_end(ws, run_id: str, report, as_json: bool) -> int:
    rows = json.loads((report.parent / "leaderboard.json").read_text())
    if as_json:
        _emit_json({"run": run_id, "report": str(report), "leaderboard": rows})
        return 0
    print(f"\nrun {run_id} finished; report: {report}")
    render.table(
        ["rank", "agent", "attempts", "accepted", "best", "SOL score", "x eager"],
        [[i + 1, r["agent"], r["attempts"], r["accepted"], r["best"], r["score"], r["speedup_eager"]]
         for i, r in enumerate(rows)],
    )
    return 0


def cmd_status(args) -> int:
    from guard.archive.db import Database
    from launcher.run import RunFolder

    ws = _workspace(args)
    db = Database(ws.db_path)
    out = []
    for folder in RunFolder.all(ws.root):
        run = folder.load()
        names = [a["name"] for a in run["agents"]]
        marks = ",".join("?" for _ in names) or "''"
        n = db.query(f"SELECT COUNT(*) AS n FROM candidates WHERE agent IN ({marks})", tuple(names))[0]["n"]
        live = run.get("state") == "running" and _pid_alive(run.get("launcher_pid"))
        out.append({"run": folder.run_id, "problem": run["problem"], "client": run["client"],
                    "agents": len(names), "state": "running" if live else run.get("state", "?"),
                    "candidates": n, "ended": run.get("ended_reason")})
    if args.json:
        _emit_json({"runs": out})
        return 0
    if not out:
        print("no runs in this workspace")
        return 0
    render.table(["run", "problem", "client", "agents", "state", "candidates", "ended"],
                 [[r["run"], r["problem"], r["client"], r["agents"], r["state"], r["candidates"], r["ended"]]
                  for r in out])
    return 0


def _pid_alive(pid) -> bool:
    import os

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

    ws = _workspace(args)
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

    ws = _workspace(args)
    runs = [r.run_id for r in RunFolder.all(ws.root)]
    if args.run not in runs:
        print(f"kernelarc: no run {args.run!r} (runs: {', '.join(runs) or 'none'})", file=sys.stderr)
        return 2
    report = build_report(ws.root, args.run)
    return _print_run_end(ws, args.run, report, args.json)


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


# -- parser ------------------------------------------------------------------------------


def device_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where to evaluate (auto: the GPU if NVML sees one, else the CPU)")


def build_parser() -> argparse.ArgumentParser:
    from guard.candidates.solution import LANGUAGES

    p = argparse.ArgumentParser(
        prog="kernelarc",
        description="Deterministic guard and MCP server for agents that optimize GPU kernels.",
    )
    p.add_argument("--version", action="version", version=f"kernelarc {__version__}")
    p.add_argument("--workspace", help="workspace folder (default $KERNELARC_WORKSPACE or ./.kernelarc)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging on stderr")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("import", help="import a SOL-ExecBench problem folder or a KernelBench file")
    s.add_argument("path")
    s.add_argument("--name", help="problem name to use instead of the definition's")
    s.add_argument("--replace", action="store_true", help="replace an imported problem of that name")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_import)

    s = sub.add_parser("problems", help="list shipped and imported problems")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_problems)

    s = sub.add_parser("submit", help="evaluate a candidate kernel and print the verdict")
    s.add_argument("file", help="a .py defining run(...) (or, for a KernelBench problem, class ModelNew), a .cu/.cpp source, or a solution.json")
    s.add_argument("--problem", required=True)
    s.add_argument("--agent", default="cli", help="who submits (default: cli)")
    device_option(s)
    s.add_argument("--language", choices=list(LANGUAGES), help="override detection")
    s.add_argument("--notes", help="what this candidate tries (kept with it)")
    s.add_argument("--parent", help="id of the candidate this one derives from")
    s.add_argument("--no-compile-baseline", action="store_true", help="skip the torch.compile baseline")
    s.add_argument("--json", action="store_true", help="last line of stdout: the verdict as JSON")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(fn=cmd_submit)

    s = sub.add_parser("leaderboard", help="each agent's best and the global best on a problem")
    s.add_argument("--problem", required=True)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_leaderboard)

    s = sub.add_parser("show", help="one candidate's verdict (and source)")
    s.add_argument("candidate")
    s.add_argument("--source", action="store_true")
    s.add_argument("--trace", action="store_true", help="print SOL-ExecBench traces (JSONL), one per workload")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_show)

    s = sub.add_parser("serve", help="run the MCP server (stdio or streamable HTTP)")
    s.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    s.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default loopback)")
    s.add_argument("--port", type=int, default=8765)
    s.add_argument("--agent", help="stdio: the agent this connection speaks for (default $KERNELARC_AGENT)")
    s.add_argument("--allow-anonymous", action="store_true", help="HTTP without tokens (every caller is 'anonymous')")
    device_option(s)
    s.add_argument("--max-wait", type=float, default=40.0, help="longest a tool call waits for a verdict (s)")
    s.add_argument("--devices", default="1",
                   help="how many GPUs of this host judge, one worker and timing slot each: N or 'all' "
                        "(default 1; on a CPU, N > 1 simulates devices that share the cores)")
    s.add_argument("--workers", type=int, default=1,
                   help="HTTP worker processes (reads scale with them; one process evaluates)")
    s.add_argument("--retention-days", type=float, help="forget conclusions older than this")
    s.add_argument("--retention-per-problem", type=int, help="keep only the newest N conclusions per problem")
    s.add_argument("--prepare", action="append", metavar="PROBLEM",
                   help="measure this problem's eager and compile baselines at start, before any candidate "
                        "(repeatable; kernelarc launch passes its problem)")
    s.set_defaults(fn=cmd_serve)

    s = sub.add_parser("token", help="bearer tokens for agents (HTTP)")
    s.add_argument("action", choices=["create", "list", "revoke"])
    s.add_argument("name", nargs="?")
    s.add_argument("--replace", action="store_true", help="create: issue a new token for an existing agent")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_token)

    s = sub.add_parser("memory", help="list, search, prune or export the shared conclusions")
    s.add_argument("action", choices=["list", "search", "prune", "export"])
    s.add_argument("query", nargs="?", help="search: the words to look for")
    s.add_argument("--problem", help="only this problem (search: the problem to rank for)")
    s.add_argument("--scope", choices=["problem", "family", "any"], default="problem")
    s.add_argument("--limit", type=int, default=20)
    s.add_argument("--days", type=float, help="prune: drop conclusions older than this")
    s.add_argument("--per-problem", type=int, help="prune: keep the newest N per problem")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_memory)

    s = sub.add_parser("launch", help="start a swarm of agents on one problem")
    s.add_argument("--problem", required=True)
    s.add_argument("--agents", type=int, default=3)
    s.add_argument("--client", choices=["claude", "codex", "scripted"], default="scripted")
    s.add_argument("--strategies", nargs="+", help="strategy names, assigned in turn (default: all, round-robin)")
    s.add_argument("--model", help="model for the claude/codex clients")
    s.add_argument("--budget-minutes", type=float, default=30.0)
    s.add_argument("--max-candidates", type=int, help="per agent")
    device_option(s)
    s.add_argument("--devices", default="1", help="GPUs of this host that judge, for the server the launcher "
                   "starts: N or 'all' (default 1)")
    s.add_argument("--server", help="URL of a running server (same workspace); default: start one")
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

    s = sub.add_parser("demo", help="the main job: a three-agent scripted swarm on a seed problem")
    device_option(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_demo)

    from .model_commands import add_parsers

    add_parsers(sub)
    from .export_commands import add_parsers as add_export_parsers

    add_export_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "token" and args.action in ("create", "revoke") and not args.name:
        parser.error(f"token {args.action} needs an agent NAME")
    _setup_logging(args.verbose)
    from guard.candidates.load import CandidateError
    from guard.cascade import GuardError
    from guard.problems.problem import ProblemError

    try:
        return args.fn(args)
    except (ProblemError, CandidateError, ValueError) as exc:
        print(f"kernelarc: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            _emit_json({"error": str(exc)})
        return 2
    except GuardError as exc:
        print(f"kernelarc: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            _emit_json({"error": str(exc)})
        return 1
    except KeyboardInterrupt:
        print("kernelarc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
