"""The memory of a workspace: conclusions with their evidence, and each agent's trajectory
(read from the guard's candidate table: nothing is recorded twice)."""

from __future__ import annotations

import json
import math
import re
import threading
import time

from guard.archive.db import Database
from guard.problems.problem import Problem

from . import conclusions as C

SCOPE_WEIGHT = {"problem": 1.0, "family": 0.6, "any": 0.3}
DUPLICATE_JACCARD = 0.8
# Recall ranks at most this many matches, the newest (the full-text index returns them in
# id order without scoring everything), so its cost does not grow with the workspace.
SEARCH_WINDOW = 100
WORD_CACHE = 20_000  # conclusions whose words recall keeps split, per process (a few MB)


def _tokens(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z0-9_]+", text) if len(w) > 1}


def jaccard(a: str, b: str) -> float:
    ta, tb = _tokens(a), _tokens(b)
    return len(ta & tb) / len(ta | tb) if ta and tb else 0.0


def _public(d: dict) -> dict:
    for internal in ("pkey", "fkey"):
        d.pop(internal, None)
    return d


class Memory:
    def __init__(self, db: Database, retention: C.Retention | None = None):
        self.db = db
        self.retention = retention or C.Retention()
        C.ensure_schema(db.reader())
        self._df: dict[str, int] = {}  # document frequencies, valid for one database version
        self._df_version = -1
        self._df_lock = threading.Lock()
        # conclusion id -> (hash of its text and tags, their words, their 5-letter stems):
        # recall scores the same conclusions again and again, and splitting their text was
        # most of its cost
        self._words: dict[int, tuple[int, frozenset[str], frozenset[str]]] = {}

    # -- writing ---------------------------------------------------------------------------
    def record(
        self, agent: str, problem: Problem, text: str, kind: str, evidence: str, tags: list[str] | None = None
    ) -> dict:
        """Record a conclusion backed by ``evidence``, a candidate of this agent's that the guard
        judged on this problem: the strength shown with the words is that of the recorder's own
        measurement, never another agent's. A near-duplicate of one of this agent's own
        conclusions strengthens it instead; another agent's conclusion is never changed."""
        text = (text or "").strip()
        tags = [t.strip().lower()[:40] for t in (tags or []) if t and t.strip()]
        if kind not in ("insight", "pitfall"):
            raise C.MemoryError_("kind must be 'insight' or 'pitfall'")
        if not text:
            raise C.MemoryError_("the conclusion text is empty")
        if len(text) > C.MAX_TEXT:
            raise C.MemoryError_(f"the conclusion is longer than {C.MAX_TEXT} characters; say it shorter")
        if len(tags) > C.MAX_TAGS:
            raise C.MemoryError_(f"at most {C.MAX_TAGS} tags")
        row = self.db.candidate(evidence) if isinstance(evidence, str) and len(evidence) < 64 else None
        if row is None:
            raise C.MemoryError_(
                f"evidence {evidence!r} is not a candidate of this workspace: cite the candidate_id "
                "of an evaluated submission"
            )
        if row["state"] != "done" or not row["decision"]:
            raise C.MemoryError_(f"candidate {evidence} has no verdict yet ({row['state']}); record after it is judged")
        if row["problem"] != problem.name:
            raise C.MemoryError_(f"candidate {evidence} was evaluated on {row['problem']!r}, not {problem.name!r}")
        if row["agent"] != agent:
            raise C.MemoryError_(
                f"candidate {evidence} is {row['agent']}'s, not yours: cite a candidate of your own that "
                "shows it (submit the idea yourself to measure it)"
            )
        copied = self.db.candidate(row["duplicate_of"]) if row["duplicate_of"] else None
        if copied is not None and copied["agent"] != agent:
            raise C.MemoryError_(
                f"candidate {evidence} is a copy of {copied['agent']}'s {copied['id']}, judged from its "
                "measurement: cite a candidate of your own that was measured"
            )
        strength = C.evidence_strength(kind, row["decision"], row["status"], row["speedup_eager"])
        family = problem.definition.kernelarc.op_family or "other"
        with self.db.transaction() as conn:
            dup = self._near_duplicate(conn, problem.name, agent, kind, text)
            if dup is not None:
                C.strengthen(conn, dup, row, strength, tags)
                merged, cid = True, dup["id"]
            else:
                cid = C.insert(
                    conn,
                    problem=problem.name,
                    op_family=family,
                    agent=agent,
                    kind=kind,
                    text=text,
                    tags=tags,
                    evidence=evidence,
                    evidence_decision=row["decision"],
                    evidence_status=row["status"],
                    evidence_speedup=row["speedup_eager"],
                    strength=strength,
                )
                merged = False
            dropped = C.prune_agent(conn, problem.name, agent, C.MAX_PER_AGENT) + C.prune(
                conn, self.retention, problem.name
            )
            stored = conn.execute("SELECT * FROM conclusions WHERE id = ?", (cid,)).fetchone()
        out = C.row_to_dict(stored) if stored is not None else {"id": cid}
        out.update(merged=merged, pruned=dropped)
        return out

    def _near_duplicate(self, conn, problem: str, agent: str, kind: str, text: str) -> dict | None:
        """One of ``agent``'s own conclusions of this kind that says nearly the same."""
        q = C.fts_query(text)
        if q is None:
            return None
        # the agent and kind filtered before the limit: other agents' similar words must not
        # hide its own and make it a second row
        rows = conn.execute(
            "SELECT c.* FROM conclusions_fts f JOIN conclusions c ON c.id = f.rowid"
            " WHERE conclusions_fts MATCH ? AND c.kind = ? AND c.agent = ? ORDER BY f.rank LIMIT 20",
            (f"{q} AND pkey : {C.key(problem)}", kind, agent),
        ).fetchall()
        for r in rows:
            if jaccard(text, r["text"]) >= DUPLICATE_JACCARD:
                return C.row_to_dict(r)
        return None

    # -- reading ---------------------------------------------------------------------------
    def recall(
        self, problem: Problem, query: str = "", scope: str = "problem", k: int = 10, now: float | None = None
    ) -> list[dict]:
        """Conclusions ranked by relevance to ``query``, scope, evidence strength and recency.

        The search has a bounded cost whatever the workspace holds: full-text matching of the
        query words (inside the scope) returns the newest SEARCH_WINDOW matches, and those are
        ranked here, relevance being the inverse-document-frequency weight of the query words
        each one contains."""
        if scope not in SCOPE_WEIGHT:
            raise C.MemoryError_("scope must be 'problem', 'family' or 'any'")
        k = max(1, min(int(k), 50))
        now = time.time() if now is None else now
        family = problem.definition.kernelarc.op_family or "other"
        conn = self.db.reader()
        age = ""
        params: list = []
        if self.retention.max_age_days is not None:
            age = " AND c.updated_at >= ?"
            params.append(now - self.retention.max_age_days * 86400)
        words = C.query_words(query)
        idf: dict[str, float] = {}
        if words:
            scope_fts = {
                "problem": f" AND pkey : {C.key(problem.name)}",
                "family": f" AND (pkey : {C.key(problem.name)} OR fkey : {C.key(family)})",
                "any": "",
            }[scope]
            df = self._frequencies(conn, words)
            n_docs = max(1, df["\0docs"])
            for w in words:
                idf[w] = math.log(1 + n_docs / (1 + df[w]))
            rows = conn.execute(
                "SELECT c.* FROM conclusions c WHERE c.id IN (SELECT rowid FROM conclusions_fts"
                f" WHERE conclusions_fts MATCH ? ORDER BY rowid DESC LIMIT {SEARCH_WINDOW}){age}",
                (C.fts_query(words) + scope_fts, *params),
            ).fetchall()
        else:
            where = {"problem": " AND c.problem = ?", "family": " AND (c.problem = ? OR c.op_family = ?)", "any": ""}[
                scope
            ]
            sparams = {"problem": [problem.name], "family": [problem.name, family], "any": []}[scope]
            rows = conn.execute(
                f"SELECT c.* FROM conclusions c WHERE 1 = 1{where}{age} ORDER BY c.id DESC LIMIT {SEARCH_WINDOW}",
                (*sparams, *params),
            ).fetchall()
        if not rows:
            return []
        total_idf = sum(idf.values()) or 1.0
        scored = []
        for r in rows:
            if words:
                # the index matches porter stems; a shared 5-letter prefix is close enough here
                present, stems = self._words_of(r["id"], r["text"] + " " + r["tags"])
                relevance = sum(v for w, v in idf.items() if w in present or w[:5] in stems) / total_idf
            else:
                relevance = 0.5
            where_w = 1.0 if r["problem"] == problem.name else (0.6 if r["op_family"] == family else 0.3)
            recency = math.exp(-max(0.0, (now - r["updated_at"]) / 86400) / 14)
            support = min(1.0, 0.2 * (r["support"] - 1))
            score = 0.45 * relevance + 0.25 * where_w + 0.2 * r["strength"] + 0.1 * recency + 0.05 * support
            scored.append((round(score, 4), r["updated_at"], r))
        scored.sort(key=lambda x: (-x[0], -x[1]))
        out = []
        for score, _, r in scored[:k]:
            d = C.row_to_dict(r)
            d["score"] = score
            for internal in ("pkey", "fkey"):
                d.pop(internal, None)
            out.append(d)
        return out

    def _words_of(self, cid: int, text: str) -> tuple[frozenset[str], frozenset[str]]:
        fingerprint = hash(text)
        hit = self._words.get(cid)
        if hit is not None and hit[0] == fingerprint:  # a conclusion whose text changed is split again
            return hit[1], hit[2]
        present = frozenset(_tokens(text))
        stems = frozenset(t[:5] for t in present)
        if len(self._words) >= WORD_CACHE:
            # the newest conclusions are the ones recall reads (it ranks the newest matches):
            # keep the newer half; replaced, not changed in place, for threads reading it
            old = self._words
            self._words = {k: old[k] for k in sorted(old)[len(old) // 2 :]}
        self._words[cid] = (fingerprint, present, stems)
        return present, stems

    def _frequencies(self, conn, words: list[str]) -> dict[str, int]:
        """How many conclusions contain each word (and, under "\0docs", how many there are),
        cached until the database changes."""
        version = self.db.version()
        with self._df_lock:
            if version != self._df_version or len(self._df) > 50_000:
                self._df, self._df_version = {}, version
            cache = self._df
        if "\0docs" not in cache:
            cache["\0docs"] = conn.execute("SELECT COALESCE(MAX(id), 0) FROM conclusions").fetchone()[0]
        for w in words:
            if w not in cache:
                row = conn.execute("SELECT doc FROM conclusions_vocab WHERE term = ?", (w,)).fetchone()
                cache[w] = row[0] if row else 0
        return cache

    def trajectory(self, agent: str, problem: str, limit: int = 20) -> list[dict]:
        """This agent's submissions on the problem, newest last."""
        rows = self.db.query(
            "SELECT id, created_at, language, state, decision, status, gate, reason, notes, score,"
            " speedup_eager, speedup_vs_best, source_hash, normalized_hash, duplicate_of, verdict_json FROM candidates"
            " WHERE problem = ? AND agent = ? ORDER BY created_at DESC LIMIT ?",
            (problem, agent, limit),
        )
        out = []
        for r in reversed(rows):
            d = dict(r)
            d["reason"] = (d.get("reason") or "")[:300]
            verdict = d.pop("verdict_json")
            d["repeats"] = json.loads(verdict).get("repeats", []) if verdict else []
            out.append(d)
        return out

    def listing(self, problem: str | None = None, limit: int = 50) -> list[dict]:
        sql = "SELECT * FROM conclusions" + (" WHERE problem = ?" if problem else "") + " ORDER BY id DESC LIMIT ?"
        rows = self.db.query(sql, ((problem,) if problem else ()) + (limit,))
        return [_public(C.row_to_dict(r)) for r in rows]

    def prune(self, retention: C.Retention, problem: str | None = None) -> int:
        with self.db.transaction() as conn:
            return C.prune(conn, retention, problem)

    def export(self, problem: str | None = None):
        """Every conclusion, oldest first (for JSON lines)."""
        sql = "SELECT * FROM conclusions" + (" WHERE problem = ?" if problem else "") + " ORDER BY id"
        for r in self.db.reader().execute(sql, (problem,) if problem else ()):
            yield _public(C.row_to_dict(r))

    def count(self) -> int:
        return int(self.db.query("SELECT COUNT(*) AS n FROM conclusions")[0]["n"])
