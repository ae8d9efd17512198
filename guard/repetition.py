"""Noticing repetition: a candidate that is the same code as an earlier one up to comments
and layout, or whose stated plan (its notes) matches one already tried on the problem.
The guard still evaluates it; the verdict and recall say what it repeats."""

from __future__ import annotations

import ast
import hashlib
import re
import sqlite3

from .candidates.c_text import without_comments
from .candidates.solution import Solution, framed
from .pyparse import parse

_WORDS = re.compile(r"[A-Za-z0-9_]+")
PLAN_SIMILARITY = 0.7


def normalized_hash(solution: Solution) -> str:
    """Identity of the code with comments, docstrings and formatting removed."""
    h = hashlib.sha256()
    for src in sorted(solution.sources, key=lambda s: s.path):
        text = src.content
        if src.path.endswith(".py"):
            try:
                tree = parse(text)
                for node in ast.walk(tree):  # docstrings are comments too
                    body = getattr(node, "body", None)
                    first = body[0] if isinstance(body, list) and body else None
                    if (
                        isinstance(first, ast.Expr)
                        and isinstance(first.value, ast.Constant)
                        and isinstance(first.value.value, str)
                    ):
                        first.value.value = ""
                text = ast.dump(tree, annotate_fields=False)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                # not Python this parser takes (too deeply nested, too large): compared as text
                text = re.sub(r"#[^\n]*", "", text)
        else:
            text = without_comments(text)  # linear: a regular expression was quadratic here
        h.update(framed(src.path) + framed(re.sub(r"\s+", "", text)))
    return h.hexdigest()


def words(text: str | None) -> set[str]:
    return {w.lower() for w in _WORDS.findall(text or "") if len(w) > 2}


def similar_plan(a: str | None, b: str | None) -> bool:
    wa, wb = words(a), words(b)
    if len(wa) < 3 or len(wb) < 3:
        return False
    return len(wa & wb) / len(wa | wb) >= PLAN_SIMILARITY


def repeats(
    conn: sqlite3.Connection,
    problem: str,
    agent: str,
    source_hash: str,
    norm_hash: str,
    notes: str | None,
    exclude: str | None = None,
) -> list[str]:
    """What an incoming candidate repeats, as sentences for the agent."""
    out: list[str] = []
    same = conn.execute(
        "SELECT id, agent, decision FROM candidates WHERE problem = ? AND normalized_hash = ?"
        " AND source_hash != ? AND id != ? AND state = 'done' ORDER BY created_at LIMIT 1",
        (problem, norm_hash, source_hash, exclude or ""),
    ).fetchone()
    if same is not None:
        who = "you" if same["agent"] == agent else same["agent"]
        out.append(
            f"the same code as {same['id']} by {who} ({same['decision']}) apart from comments "
            "and layout: it measures the same kernel again"
        )
    if notes and len(words(notes)) >= 3:
        rows = conn.execute(
            "SELECT id, agent, decision, notes FROM candidates WHERE problem = ? AND notes IS NOT NULL"
            " AND id != ? AND state = 'done' ORDER BY created_at DESC LIMIT 200",
            (problem, exclude or ""),
        ).fetchall()
        for r in rows:
            if similar_plan(notes, r["notes"]):
                who = "you" if r["agent"] == agent else r["agent"]
                out.append(
                    f"a plan like this was tried in {r['id']} by {who} ({r['decision']}): {(r['notes'] or '')[:160]}"
                )
                break
    return out
