"""``kernelarc import`` and ``kernelarc problems``: the problems a workspace knows."""

from __future__ import annotations

from pathlib import Path

from ..common import emit_json, open_workspace, print_listing


def cmd_import(args) -> int:
    from guard.problems.summary import summarize

    ws = open_workspace(args)
    problem, notes = ws.problems().import_path(Path(args.path), name=args.name, replace=args.replace)
    if args.json:
        emit_json({"imported": problem.name, "notes": notes, "summary": summarize(problem)})
    else:
        print(f"imported {problem.name} into {ws.problems_dir / problem.name}")
        for n in notes:
            print(f"  note: {n}")
    return 0


def cmd_problems(args) -> int:
    from guard.problems.summary import human_bytes, summarize

    ws = open_workspace(args)
    summaries = [summarize(p) for p in ws.problems().list()]
    return print_listing(
        args.json,
        {"problems": summaries},
        ["problem", "origin", "family", "workloads", "dtypes", "largest I/O", "max GFLOP", "seeds"],
        (
            [
                s["name"][:60],
                s["origin"],
                s["op_family"],
                s["workloads"],
                ",".join(s["dtypes"]),
                human_bytes(s["max_io_bytes"]),
                (s["max_flops"] / 1e9) if s["max_flops"] else None,
                len(s["seed_kernels"]),
            ]
            for s in summaries
        ),
    )


def add_parsers(sub) -> None:
    s = sub.add_parser("import", help="import a SOL-ExecBench problem folder or a KernelBench file")
    s.add_argument("path")
    s.add_argument("--name", help="problem name to use instead of the definition's")
    s.add_argument("--replace", action="store_true", help="replace an imported problem of that name")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_import)

    s = sub.add_parser("problems", help="list shipped and imported problems")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_problems)
