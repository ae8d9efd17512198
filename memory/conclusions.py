"""Conclusions: short statements of what worked (insight) or what to avoid (pitfall), each
tied to a candidate the guard evaluated. Kept in the workspace database with a full-text
index (SQLite FTS5); retention by age and/or by count per problem.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time
from dataclasses import dataclass
from typing import Literal

Kind = Literal["insight", "pitfall"]
Scope = Literal["problem", "family", "any"]
MAX_TEXT = 1000
MAX_TAGS = 10
# conclusions one agent keeps per problem, whatever the retention: beyond, its own oldest go
# (recall ranks the newest matches; a red team's 100 records hid every other agent's)
MAX_PER_AGENT = 25

SCHEMA = """
CREATE TABLE IF NOT EXISTS conclusions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    problem TEXT NOT NULL,
    op_family TEXT NOT NULL,
    agent TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('insight', 'pitfall')),
    text TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    evidence TEXT NOT NULL,
    evidence_decision TEXT,
    evidence_status TEXT,
    evidence_speedup REAL,
    strength REAL NOT NULL,
    support INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    pkey TEXT NOT NULL,                -- one-token keys of the problem and the op family,
    fkey TEXT NOT NULL                 -- so a scoped full-text search is a term intersection
);
CREATE INDEX IF NOT EXISTS concl_problem ON conclusions(problem, created_at);
CREATE INDEX IF NOT EXISTS concl_family ON conclusions(op_family, created_at);
CREATE INDEX IF NOT EXISTS concl_problem_id ON conclusions(problem, id);
CREATE INDEX IF NOT EXISTS concl_family_id ON conclusions(op_family, id);
CREATE VIRTUAL TABLE IF NOT EXISTS conclusions_fts USING fts5(
    text, tags, pkey, fkey, content='conclusions', content_rowid='id', tokenize='porter unicode61'
);
CREATE VIRTUAL TABLE IF NOT EXISTS conclusions_vocab USING fts5vocab(conclusions_fts, 'row');
CREATE TRIGGER IF NOT EXISTS concl_ai AFTER INSERT ON conclusions BEGIN
    INSERT INTO conclusions_fts(rowid, text, tags, pkey, fkey) VALUES (new.id, new.text, new.tags, new.pkey, new.fkey);
END;
-- every candidate cited for a conclusion, once: its support is how many
CREATE TABLE IF NOT EXISTS conclusion_evidence (
    conclusion INTEGER NOT NULL,
    candidate TEXT NOT NULL,
    PRIMARY KEY (conclusion, candidate)
);
CREATE TRIGGER IF NOT EXISTS concl_evidence_ad AFTER DELETE ON conclusions BEGIN
    DELETE FROM conclusion_evidence WHERE conclusion = old.id;
END;
CREATE TRIGGER IF NOT EXISTS concl_ad AFTER DELETE ON conclusions BEGIN
    INSERT INTO conclusions_fts(conclusions_fts, rowid, text, tags, pkey, fkey)
    VALUES ('delete', old.id, old.text, old.tags, old.pkey, old.fkey);
END;
CREATE TRIGGER IF NOT EXISTS concl_au AFTER UPDATE OF text, tags ON conclusions BEGIN
    INSERT INTO conclusions_fts(conclusions_fts, rowid, text, tags, pkey, fkey)
    VALUES ('delete', old.id, old.text, old.tags, old.pkey, old.fkey);
    INSERT INTO conclusions_fts(rowid, text, tags, pkey, fkey) VALUES (new.id, new.text, new.tags, new.pkey, new.fkey);
END;
"""


class MemoryError_(ValueError):
    """A conclusion that cannot be recorded; the message says why."""


@dataclass(frozen=True)
class Retention:
    """Keep conclusions younger than ``max_age_days`` and/or the newest ``per_problem``."""

    max_age_days: float | None = None
    per_problem: int | None = None


def evidence_strength(kind: str, decision: str | None, status: str | None, speedup: float | None) -> float:
    """How strongly an evaluated candidate supports a conclusion, in [0, 1].

    An insight is best supported by an ACCEPT (more so with a larger measured speedup over
    the eager baseline), a pitfall by a REJECT or a REVERT."""
    if kind == "insight":
        base = {"ACCEPT": 0.7, "KEEP": 0.45, "REVERT": 0.2, "REJECT": 0.05}.get(decision or "", 0.0)
        if speedup and speedup > 1:
            base += min(0.3, 0.1 * (speedup - 1))
        return min(1.0, base)
    return {"REJECT": 0.8, "REVERT": 0.7, "KEEP": 0.4, "ACCEPT": 0.2}.get(decision or "", 0.0)


_WORD = re.compile(r"[A-Za-z0-9_]+")


def query_words(text: str) -> list[str]:
    words = [w.lower() for w in _WORD.findall(text or "")][:32]
    return list(dict.fromkeys(w for w in words if len(w) > 1))


def fts_query(text: str | list[str]) -> str | None:
    """A safe FTS5 query from free text (or its words): the words, OR-ed, each quoted,
    searched in the text and tags columns."""
    words = query_words(text) if isinstance(text, str) else text
    return "{text tags} : (" + " OR ".join(f'"{w}"' for w in words) + ")" if words else None


def key(value: str) -> str:
    """A one-token full-text key for a problem or family name."""
    return "k" + hashlib.sha1(value.encode()).hexdigest()[:16]


def ensure_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)


def row_to_dict(row: sqlite3.Row) -> dict:
    d = dict(row)
    d["tags"] = json.loads(d.get("tags") or "[]")
    return d


def insert(conn: sqlite3.Connection, **fields) -> int:
    now = time.time()
    fields.setdefault("created_at", now)
    fields.setdefault("updated_at", now)
    fields["tags"] = json.dumps(sorted(set(fields.get("tags") or [])))
    fields["pkey"] = key(fields["problem"])
    fields["fkey"] = key(fields["op_family"])
    cols = ", ".join(fields)
    marks = ", ".join("?" for _ in fields)
    cur = conn.execute(f"INSERT INTO conclusions ({cols}) VALUES ({marks})", tuple(fields.values()))
    cid = int(cur.lastrowid)
    conn.execute("INSERT OR IGNORE INTO conclusion_evidence VALUES (?, ?)", (cid, fields["evidence"]))
    return cid


def strengthen(conn: sqlite3.Connection, entry: dict, evidence: sqlite3.Row, strength: float, tags: list[str]) -> None:
    """A near-duplicate recorded again by its own agent: one more support for each candidate
    never cited for it before (citing one again adds nothing, however the citations alternate),
    the tags merged within ``MAX_TAGS``, and where the new evidence is stronger it becomes the
    evidence shown, so that the strength shown is that of the candidate named beside it as it
    was judged when recorded (a later revocation does not lower it)."""
    conn.execute("INSERT OR IGNORE INTO conclusion_evidence VALUES (?, ?)", (entry["id"], entry["evidence"]))
    fresh = conn.execute(
        "INSERT OR IGNORE INTO conclusion_evidence VALUES (?, ?)", (entry["id"], evidence["id"])
    ).rowcount
    fields: dict[str, object] = {
        "support": entry["support"] + fresh,
        # its own tags first, then new ones while there is room: never more than a record may
        # carry (a red team's 400 merges made 3,614 tags, 158 KB in every recall)
        "tags": json.dumps(sorted(list(dict.fromkeys([*entry["tags"], *tags]))[:MAX_TAGS])),
        "updated_at": time.time(),
    }
    if strength > entry["strength"]:
        fields.update(
            strength=strength,
            evidence=evidence["id"],
            evidence_decision=evidence["decision"],
            evidence_status=evidence["status"],
            evidence_speedup=evidence["speedup_eager"],
        )
    sets = ", ".join(f"{name} = ?" for name in fields)
    conn.execute(f"UPDATE conclusions SET {sets} WHERE id = ?", (*fields.values(), entry["id"]))


def prune(conn: sqlite3.Connection, retention: Retention, problem: str | None = None, now: float | None = None) -> int:
    """Apply retention; returns how many conclusions were dropped."""
    now = time.time() if now is None else now
    dropped = 0
    if retention.max_age_days is not None:
        cur = conn.execute(
            "DELETE FROM conclusions WHERE updated_at < ?" + (" AND problem = ?" if problem else ""),
            (now - retention.max_age_days * 86400, *([problem] if problem else [])),
        )
        dropped += cur.rowcount
    if retention.per_problem is not None:
        problems = [problem] if problem else [r[0] for r in conn.execute("SELECT DISTINCT problem FROM conclusions")]
        for p in problems:
            dropped += _prune_fairly(conn, p, retention.per_problem)
    return dropped


def prune_agent(conn: sqlite3.Connection, problem: str, agent: str, keep: int) -> int:
    """Down to ``agent``'s newest ``keep`` conclusions of ``problem``."""
    cur = conn.execute(
        "DELETE FROM conclusions WHERE problem = ? AND agent = ? AND id NOT IN ("
        " SELECT id FROM conclusions WHERE problem = ? AND agent = ? ORDER BY updated_at DESC, id DESC LIMIT ?)",
        (problem, agent, problem, agent, keep),
    )
    return cur.rowcount


def _prune_fairly(conn: sqlite3.Connection, problem: str, keep: int) -> int:
    """Down to ``keep`` conclusions of ``problem``, each time the oldest of the agent that holds
    the most: an agent that records many conclusions pushes out its own, never the only few
    of the others (a red team's 20 records once left that agent's alone)."""
    dropped = 0
    while True:
        counts = conn.execute(
            "SELECT agent, COUNT(*) AS n FROM conclusions WHERE problem = ? GROUP BY agent", (problem,)
        ).fetchall()
        if sum(n for _, n in counts) <= keep:
            return dropped
        most = max(n for _, n in counts)
        leaders = [a for a, n in counts if n == most]
        oldest = conn.execute(
            f"SELECT id FROM conclusions WHERE problem = ? AND agent IN ({','.join('?' for _ in leaders)})"
            " ORDER BY updated_at, id LIMIT 1",
            (problem, *leaders),
        ).fetchone()
        conn.execute("DELETE FROM conclusions WHERE id = ?", (oldest[0],))
        dropped += 1
