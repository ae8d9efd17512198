"""``kernelarc memory``: list, search, prune or export the shared conclusions."""

from __future__ import annotations

import json
import sys

from ..common import emit_json, open_workspace, print_listing


def cmd_memory(args) -> int:
    from guard.archive.db import Database
    from memory.conclusions import Retention
    from memory.store import Memory

    ws = open_workspace(args)
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
            emit_json({"pruned": n, "left": mem.count()})
        else:
            print(f"pruned {n} conclusion(s); {mem.count()} left")
        return 0
    else:  # export: JSON lines on stdout
        for row in mem.export(args.problem):
            sys.stdout.write(json.dumps(row) + "\n")
        return 0
    return print_listing(
        args.json,
        {"conclusions": rows},
        ["id", "problem", "kind", "agent", "evidence", "strength", "support", "text"],
        (
            [
                r["id"],
                r["problem"][:28],
                r["kind"],
                r["agent"],
                r["evidence"],
                r["strength"],
                r["support"],
                r["text"][:70],
            ]
            for r in rows
        ),
        empty="no conclusions",
    )


def add_parsers(sub) -> None:
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
