"""The workspace database: every candidate, its per-workload results, cached baselines.

SQLite in WAL mode, one short transaction per state change, so a process killed in the
middle of an evaluation loses nothing that had finished; the unfinished candidate is marked
``interrupted`` by the next process that opens the workspace.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..processes import pid_exists

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS candidates (
    id TEXT PRIMARY KEY,
    problem TEXT NOT NULL,
    definition_hash TEXT NOT NULL,
    agent TEXT NOT NULL,
    parent TEXT,
    notes TEXT,
    language TEXT,
    source_hash TEXT NOT NULL,
    normalized_hash TEXT,
    solution_json TEXT NOT NULL,
    device_key TEXT NOT NULL,         -- the comparison group (GPUs of one model, or this CPU)
    device_kind TEXT NOT NULL,
    measured_on TEXT,                 -- the physical device that took the measurements
    state TEXT NOT NULL,              -- queued, running, done, interrupted, error
    decision TEXT, status TEXT, gate TEXT, reason TEXT, diagnostic TEXT,
    first_failing_workload TEXT,
    score REAL, speedup_eager REAL, speedup_compile REAL, sol_fraction REAL,
    latency_ms REAL, speedup_vs_best REAL, threshold REAL,
    global_best INTEGER NOT NULL DEFAULT 0,
    duplicate_of TEXT,
    verdict_json TEXT,
    created_at REAL NOT NULL, started_at REAL, finished_at REAL,
    pid INTEGER, host TEXT
);
CREATE INDEX IF NOT EXISTS cand_problem_agent ON candidates(problem, agent, created_at);
CREATE INDEX IF NOT EXISTS cand_hash ON candidates(problem, source_hash);
CREATE INDEX IF NOT EXISTS cand_decision ON candidates(problem, decision, agent, finished_at);
CREATE INDEX IF NOT EXISTS cand_global ON candidates(problem, global_best, finished_at);
CREATE TABLE IF NOT EXISTS workload_results (
    candidate_id TEXT NOT NULL REFERENCES candidates(id),
    workload TEXT NOT NULL,
    latency_ms REAL, eager_ms REAL, compile_ms REAL, sol_ms REAL,
    speedup_eager REAL, speedup_compile REAL, sol_score REAL, rel_se REAL,
    result_json TEXT,
    PRIMARY KEY (candidate_id, workload)
);
CREATE TABLE IF NOT EXISTS baselines (
    definition_hash TEXT NOT NULL,
    workload TEXT NOT NULL,
    device_key TEXT NOT NULL,
    result_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (definition_hash, workload, device_key)
);
"""

# what a decision's advice reads of an agent's history (``decision.advise``); notes and reasons
# are bounded (2000 characters), solutions and verdicts are not
HISTORY_COLUMNS = "id, decision, created_at, language, notes, reason"
RESULT_COLUMNS = (
    "decision",
    "status",
    "gate",
    "reason",
    "diagnostic",
    "first_failing_workload",
    "score",
    "speedup_eager",
    "speedup_compile",
    "sol_fraction",
    "latency_ms",
    "speedup_vs_best",
    "threshold",
    "global_best",
    "duplicate_of",
    "verdict_json",
)


def new_candidate_id() -> str:
    return "c-" + uuid.uuid4().hex[:10]


class Database:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._local = threading.local()
        self._version_lock = threading.Lock()
        self._version_conn: sqlite3.Connection | None = None
        conn = self._conn()
        conn.executescript(SCHEMA)  # idempotent; executescript commits on its own
        self._migrate(conn)
        conn.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
            (str(SCHEMA_VERSION),),
        )
        self.mark_interrupted()

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Columns added after a workspace was created."""
        have = {r[1] for r in conn.execute("PRAGMA table_info(candidates)")}
        if "normalized_hash" not in have:
            conn.execute("ALTER TABLE candidates ADD COLUMN normalized_hash TEXT")
        if "measured_on" not in have:
            conn.execute("ALTER TABLE candidates ADD COLUMN measured_on TEXT")
        conn.execute("CREATE INDEX IF NOT EXISTS cand_norm ON candidates(problem, normalized_hash)")

    # -- connections ----------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE: one writer at a time across processes, so a decision reads
        the current bests and records its verdict atomically."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def version(self) -> int:
        """Changes whenever any connection (of any process) commits to the database: for
        caches of derived views."""
        with self._version_lock:
            if self._version_conn is None:
                self._version_conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            return int(self._version_conn.execute("PRAGMA data_version").fetchone()[0])

    def reader(self) -> sqlite3.Connection:
        """This thread's connection, for reads outside a transaction."""
        return self._conn()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        return self._conn().execute(sql, params).fetchall()

    # -- candidates ----------------------------------------------------------------------------
    def adopt_device(self, key: str, group: str) -> None:
        """Rows keyed by a physical device before devices had groups move to the group, the
        device kept as where they were measured."""
        if key == group:
            return
        # a read first: every server process builds a guard, and most find nothing to move
        if not self._conn().execute("SELECT 1 FROM candidates WHERE device_key = ? LIMIT 1", (key,)).fetchone():
            return
        with self.transaction() as c:
            c.execute(
                "UPDATE candidates SET measured_on = device_key, device_key = ? WHERE device_key = ?", (group, key)
            )

    def insert_candidate(self, **fields: Any) -> str:
        cid = fields.pop("id", None) or new_candidate_id()
        fields.update(id=cid, created_at=time.time(), pid=os.getpid(), host=socket.gethostname())
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        with self.transaction() as c:
            c.execute(f"INSERT INTO candidates ({cols}) VALUES ({marks})", tuple(fields.values()))
        return cid

    def set_state(self, cid: str, state: str, **extra: Any) -> None:
        fields = {"state": state, **extra}
        if state == "running":
            fields["started_at"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self.transaction() as c:
            c.execute(f"UPDATE candidates SET {sets} WHERE id = ?", (*fields.values(), cid))

    def finish(self, c: sqlite3.Connection, cid: str, result: dict[str, Any], workloads: list[dict[str, Any]]) -> None:
        """Record a verdict inside the caller's transaction."""
        fields = {k: result.get(k) for k in RESULT_COLUMNS}
        fields.update(state="done", finished_at=time.time())
        sets = ", ".join(f"{k} = ?" for k in fields)
        c.execute(f"UPDATE candidates SET {sets} WHERE id = ?", (*fields.values(), cid))
        for w in workloads:
            c.execute(
                "INSERT OR REPLACE INTO workload_results (candidate_id, workload, latency_ms,"
                " eager_ms, compile_ms, sol_ms, speedup_eager, speedup_compile, sol_score,"
                " rel_se, result_json) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    cid,
                    w["uuid"],
                    w.get("latency_ms"),
                    w.get("eager_ms"),
                    w.get("compile_ms"),
                    w.get("sol_ms"),
                    w.get("speedup_eager"),
                    w.get("speedup_compile"),
                    w.get("sol_score"),
                    w.get("rel_se"),
                    json.dumps(w),
                ),
            )

    def revoke(self, cid: str, status: str, reason: str) -> list[str]:
        """Turn a stored ACCEPT into a REJECT: the candidate was caught (REWARD_HACK) when it
        was timed again. It stops being anyone's best; the bests before it become the bests
        again (the latest ACCEPT of its agent; the latest global best still flagged). So does
        every other row of the same source on the same problem version and device: the same
        code, copies judged from it before and what it copied (a copy of a caught kernel
        once kept its ACCEPT, and one submitted after took the title back). The stored
        verdicts say so too. Returns the ids revoked."""
        with self.transaction() as c:
            row = c.execute(
                "SELECT problem, definition_hash, source_hash, device_key FROM candidates WHERE id = ?", (cid,)
            ).fetchone()
            if row is None:
                return []
            same = c.execute(
                "SELECT id, verdict_json FROM candidates WHERE problem = ? AND definition_hash = ?"
                " AND source_hash = ? AND device_key = ? AND (decision != 'REJECT' OR id = ?)",
                (*row, cid),
            ).fetchall()
            for r in same:
                why = reason if r["id"] == cid else f"identical to {cid}, which was caught: {reason}"
                verdict = json.loads(r["verdict_json"]) if r["verdict_json"] else None
                if verdict is not None:
                    verdict.update(decision="REJECT", status=status, gate="benchmark", reason=why, is_global_best=False)
                c.execute(
                    "UPDATE candidates SET decision = 'REJECT', status = ?, gate = 'benchmark', reason = ?,"
                    " global_best = 0, verdict_json = COALESCE(?, verdict_json) WHERE id = ?",
                    (status, why, json.dumps(verdict) if verdict is not None else None, r["id"]),
                )
            return sorted(r["id"] for r in same)

    def candidate(self, cid: str) -> sqlite3.Row | None:
        rows = self.query("SELECT * FROM candidates WHERE id = ?", (cid,))
        return rows[0] if rows else None

    def workload_results(self, cid: str) -> list[dict[str, Any]]:
        rows = self.query("SELECT result_json FROM workload_results WHERE candidate_id = ? ORDER BY rowid", (cid,))
        return [json.loads(r["result_json"]) for r in rows]

    def find_evaluated(
        self, problem: str, definition_hash: str, source_hash: str, device_key: str
    ) -> sqlite3.Row | None:
        """A definitive earlier verdict on the same source: measured, or rejected for what
        the source does. Compile errors, crashes and timeouts may come from the machine
        (a missing toolkit, memory taken by others), so those are evaluated again."""
        rows = self.query(
            "SELECT * FROM candidates WHERE problem = ? AND definition_hash = ? AND source_hash = ?"
            " AND device_key = ? AND state = 'done' AND duplicate_of IS NULL"
            " AND (decision != 'REJECT' OR status IN"
            " ('INCORRECT_SHAPE', 'INCORRECT_DTYPE', 'INCORRECT_NUMERICAL', 'REWARD_HACK'))"
            " ORDER BY created_at LIMIT 1",
            (problem, definition_hash, source_hash, device_key),
        )
        return rows[0] if rows else None

    def agent_best(
        self, c: sqlite3.Connection, problem: str, definition_hash: str, agent: str, device_key: str
    ) -> sqlite3.Row | None:
        rows = c.execute(
            "SELECT * FROM candidates WHERE problem = ? AND definition_hash = ? AND agent = ?"
            " AND device_key = ? AND decision = 'ACCEPT' ORDER BY finished_at DESC LIMIT 1",
            (problem, definition_hash, agent, device_key),
        ).fetchall()
        return rows[0] if rows else None

    def global_best(
        self, c: sqlite3.Connection, problem: str, definition_hash: str, device_key: str
    ) -> sqlite3.Row | None:
        rows = c.execute(
            "SELECT * FROM candidates WHERE problem = ? AND definition_hash = ? AND device_key = ?"
            " AND global_best = 1 ORDER BY finished_at DESC LIMIT 1",
            (problem, definition_hash, device_key),
        ).fetchall()
        return rows[0] if rows else None

    def agent_history(self, c: sqlite3.Connection, problem: str, agent: str) -> list[sqlite3.Row]:
        """An agent's judged candidates of a problem, oldest first: what a decision's advice
        reads of them, never their solutions and verdicts (read for every verdict, they once
        took 104 MB after 400 submissions of 250 KB)."""
        return c.execute(
            f"SELECT {HISTORY_COLUMNS} FROM candidates WHERE problem = ? AND agent = ? AND state = 'done'"
            " ORDER BY created_at",
            (problem, agent),
        ).fetchall()

    def candidates_for(self, problem: str | None = None, limit: int = 1000) -> list[sqlite3.Row]:
        if problem:
            return self.query(
                "SELECT * FROM candidates WHERE problem = ? ORDER BY created_at DESC LIMIT ?",
                (problem, limit),
            )
        return self.query("SELECT * FROM candidates ORDER BY created_at DESC LIMIT ?", (limit,))

    def mark_interrupted(self) -> int:
        """Candidates left 'running' by a process that no longer exists on this host."""
        host = socket.gethostname()
        stale = []
        for row in self.query("SELECT id, pid, host FROM candidates WHERE state IN ('running', 'queued')"):
            if row["host"] == host and row["pid"] and not _pid_alive(row["pid"]):
                stale.append(row["id"])
        if stale:
            with self.transaction() as c:
                c.executemany(
                    "UPDATE candidates SET state = 'interrupted', reason = 'the evaluating process"
                    " stopped before a verdict' WHERE id = ?",
                    [(s,) for s in stale],
                )
        return len(stale)

    # -- baselines ---------------------------------------------------------------------------
    def baseline(self, definition_hash: str, workload: str, device_key: str) -> dict[str, Any] | None:
        rows = self.query(
            "SELECT result_json FROM baselines WHERE definition_hash = ? AND workload = ? AND device_key = ?",
            (definition_hash, workload, device_key),
        )
        return json.loads(rows[0]["result_json"]) if rows else None

    def put_baseline(self, definition_hash: str, workload: str, device_key: str, result: dict[str, Any]) -> None:
        with self.transaction() as c:
            c.execute(
                "INSERT OR REPLACE INTO baselines VALUES (?,?,?,?,?)",
                (definition_hash, workload, device_key, json.dumps(result), time.time()),
            )

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _pid_alive(pid: int) -> bool:
    return pid == os.getpid() or pid_exists(pid)
