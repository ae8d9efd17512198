"""``kernelarc submit``, ``leaderboard`` and ``show``: one candidate judged from the command line,
and what the archive holds."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import render
from ..common import device_option, emit_json, open_workspace, print_listing


def _guard(args, ws):
    from guard.cascade import Guard

    overrides = {}
    if getattr(args, "no_compile_baseline", False):
        overrides["compile_baseline"] = False
    # one candidate: a spare worker started at once overlaps the baselines; none after it
    guard = Guard(ws, ws.config(**overrides), device=args.device, keep_spare=False)
    guard.warm_up()
    return guard


def cmd_submit(args) -> int:
    from guard.candidates.load import from_file

    ws = open_workspace(args)
    solution = from_file(Path(args.file), language=args.language)
    progress = render.ProgressLine(enabled=not args.quiet)
    with _guard(args, ws) as guard:
        try:
            verdict = guard.evaluate(
                solution,
                args.problem,
                agent=args.agent,
                notes=args.notes,
                parent=args.parent,
                progress=progress,
            )
        finally:
            progress.finish()
    if args.json:
        emit_json(verdict.model_dump(mode="json"))
    else:
        render.verdict(verdict)
    return 0


def cmd_leaderboard(args) -> int:
    from guard.archive.db import Database
    from guard.leaderboard import leaderboard

    ws = open_workspace(args)
    ws.problems().get(args.problem)  # a clear error for an unknown name
    board = leaderboard(Database(ws.db_path), args.problem)
    return print_listing(
        args.json,
        board,
        [
            "rank",
            "agent",
            "candidate",
            "lang",
            "SOL score",
            "x eager",
            "x compile",
            "SOL frac",
            "latency",
            "attempts",
            "",
        ],
        (
            [
                i + 1,
                e["agent"],
                e["candidate_id"],
                e["language"],
                e["score"],
                e["speedup_eager"],
                e["speedup_compile"],
                e["sol_fraction"],
                render.ms(e["latency_ms"]),
                e["attempts"],
                "global best" if e["is_global_best"] else "",
            ]
            for i, e in enumerate(board["agents"])
        ),
        empty=f"no accepted candidate for {args.problem} yet ({board['candidates']} submitted)",
    )


def cmd_show(args) -> int:
    from guard.archive.db import Database
    from guard.leaderboard import candidate_detail

    if args.trace:  # SOL-ExecBench trace JSONL instead of the verdict
        from .export import show_trace

        return show_trace(args)
    ws = open_workspace(args)
    detail = candidate_detail(Database(ws.db_path), args.candidate)
    if detail is None:
        print(f"no candidate {args.candidate!r}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(detail)
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


def add_parsers(sub) -> None:
    from guard.candidates.solution import LANGUAGES

    s = sub.add_parser("submit", help="evaluate a candidate kernel and print the verdict")
    s.add_argument(
        "file",
        help="a .py defining run(...) (or, for a KernelBench problem, class ModelNew), "
        "a .cu/.cpp source, or a solution.json",
    )
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
