"""The read-only leaderboard: the global best and each agent's best on a problem."""

from __future__ import annotations

import json
from typing import Any

from .archive.db import Database


def leaderboard(
    db: Database, problem: str, device_key: str | None = None, definition_hash: str | None = None
) -> dict[str, Any]:
    """Rows ordered by SOL score (then speedup), each agent's latest accepted candidate."""
    where = "problem = ? AND decision = 'ACCEPT'"
    params: list[str] = [problem]
    if device_key:
        where += " AND device_key = ?"
        params.append(device_key)
    if definition_hash:
        where += " AND definition_hash = ?"
        params.append(definition_hash)
    best_rows = db.query(
        "SELECT * FROM (SELECT c.*, ROW_NUMBER() OVER (PARTITION BY agent ORDER BY finished_at DESC) AS rn"
        f" FROM candidates c WHERE {where}) WHERE rn = 1",
        tuple(params),
    )
    best_by_agent = {r["agent"]: dict(r) for r in best_rows}
    counts = {
        r["agent"]: (r["n"], r["last"])
        for r in db.query(
            "SELECT agent, COUNT(*) AS n, MAX(created_at) AS last FROM candidates WHERE problem = ? GROUP BY agent",
            (problem,),
        )
    }
    g = db.query(
        f"SELECT * FROM candidates WHERE {where} AND global_best = 1 ORDER BY finished_at DESC LIMIT 1", tuple(params)
    )
    global_best = dict(g[0]) if g else None
    entries = []
    for agent, r in best_by_agent.items():
        entries.append(
            {
                "agent": agent,
                "candidate_id": r["id"],
                "language": r["language"],
                "score": r["score"],
                "speedup_eager": r["speedup_eager"],
                "speedup_compile": r["speedup_compile"],
                "sol_fraction": r["sol_fraction"],
                "latency_ms": r["latency_ms"],
                "attempts": counts.get(agent, (0, None))[0],
                "is_global_best": bool(global_best and global_best["id"] == r["id"]),
                "device_key": r["device_key"],
            }
        )
    entries.sort(key=lambda e: (-(e["score"] or 0), -(e["speedup_eager"] or 0)))
    return {
        "problem": problem,
        "global_best": None
        if global_best is None
        else {
            "candidate_id": global_best["id"],
            "agent": global_best["agent"],
            "score": global_best["score"],
            "speedup_eager": global_best["speedup_eager"],
            "latency_ms": global_best["latency_ms"],
        },
        "agents": entries,
        "candidates": sum(n for n, _ in counts.values()),
    }


def candidate_detail(db: Database, cid: str) -> dict[str, Any] | None:
    row = db.candidate(cid)
    if row is None:
        return None
    out = dict(row)
    out["solution"] = json.loads(out.pop("solution_json"))
    verdict = out.pop("verdict_json")
    out["verdict"] = json.loads(verdict) if verdict else None
    return out
