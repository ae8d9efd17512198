"""A queue of evaluations in front of one Guard, kept in the workspace database so that a
job survives a restart of the server: one that was queued or running when the process
stopped is queued again when the next one starts (its unfinished candidate is marked
interrupted by the database).

Submitting returns at once with a job id; ``wait`` blocks for a bounded time (MCP clients
give up on a tool call after about 60 s) and reports progress while it waits.

With several guards (one per GPU of the host) each has its own thread; a thread claims the
oldest queued job in one transaction, so no job runs twice, and the job records the device
that judged it.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .candidates.solution import Solution
from .cascade import Guard, GuardError
from .verdict import Verdict

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    problem TEXT NOT NULL,
    solution_json TEXT NOT NULL,
    notes TEXT,
    parent TEXT,
    state TEXT NOT NULL,            -- queued, running, done, error
    candidate_id TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    device TEXT                     -- the device (physical key) that judged it
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, created_at);
"""


@dataclass
class JobView:
    id: str
    agent: str
    problem: str
    state: str
    candidate_id: str | None = None
    error: str | None = None
    position: int | None = None  # jobs ahead of this one in the queue
    progress: dict[str, Any] = field(default_factory=dict)
    verdict: Verdict | None = None
    device: str | None = None


class JobQueue:
    def __init__(self, guards: Guard | Sequence[Guard], autostart: bool = True, recover: bool = True):
        self.guards = [guards] if isinstance(guards, Guard) else list(guards)
        if not self.guards:
            raise ValueError("a job queue needs at least one guard")
        if len({g.device.key for g in self.guards}) != len(self.guards):
            raise ValueError("two guards on one device would share its timing slot: one guard per device")
        self.guard = self.guards[0]  # problems and configuration are the same for all
        self.db = self.guard.db
        self.db.reader().executescript(SCHEMA)
        if "device" not in {r[1] for r in self.db.reader().execute("PRAGMA table_info(jobs)")}:
            self.db.reader().execute("ALTER TABLE jobs ADD COLUMN device TEXT")
        self._cv = threading.Condition()
        self._progress: dict[str, dict[str, Any]] = {}
        self._stop = False
        if recover:
            with self.db.transaction() as c:  # what a stopped process left behind runs again
                c.execute("UPDATE jobs SET state = 'queued', started_at = NULL WHERE state = 'running'")
        self._threads = [
            threading.Thread(target=self._loop, args=(g,), name=f"kernelarc-jobs-{i}", daemon=True)
            for i, g in enumerate(self.guards)
        ]
        if autostart:
            for t in self._threads:
                t.start()

    # -- API ---------------------------------------------------------------------------------
    def submit(self, agent: str, problem: str, solution: Solution, notes: str | None = None,
               parent: str | None = None) -> str:
        self.guard.store.get(problem)  # unknown problem: fail now, not in the queue
        job_id = "j-" + uuid.uuid4().hex[:12]
        with self.db.transaction() as c:
            c.execute(
                "INSERT INTO jobs (id, agent, problem, solution_json, notes, parent, state, created_at)"
                " VALUES (?,?,?,?,?,?, 'queued', ?)",
                (job_id, agent, problem, solution.model_dump_json(exclude_none=True), notes, parent, time.time()),
            )
        with self._cv:
            self._cv.notify_all()
        return job_id

    def get(self, job_id: str) -> JobView | None:
        rows = self.db.query("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        r = rows[0]
        view = JobView(r["id"], r["agent"], r["problem"], r["state"], r["candidate_id"], r["error"],
                       device=r["device"])
        if r["state"] == "queued":
            view.position = int(self.db.query(
                "SELECT COUNT(*) AS n FROM jobs WHERE state IN ('queued', 'running') AND created_at < ?",
                (r["created_at"],),
            )[0]["n"])
        view.progress = dict(self._progress.get(job_id, {}))
        if r["state"] == "done" and r["candidate_id"]:
            cand = self.db.candidate(r["candidate_id"])
            if cand is not None and cand["verdict_json"]:
                view.verdict = Verdict.model_validate_json(cand["verdict_json"])
        return view

    def wait(self, job_id: str, timeout: float, on_progress: Callable[[dict[str, Any]], None] | None = None) -> JobView | None:
        """Block until the job is done or ``timeout`` passes; ``on_progress`` sees each
        change of the progress while waiting."""
        deadline = time.monotonic() + max(0.0, timeout)
        last = None
        while True:
            view = self.get(job_id)
            if view is None or view.state in ("done", "error"):
                return view
            if on_progress is not None and view.progress and view.progress != last:
                last = dict(view.progress)
                on_progress(last)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return view
            with self._cv:
                self._cv.wait(min(remaining, 0.5))

    def pending(self) -> int:
        return int(self.db.query("SELECT COUNT(*) AS n FROM jobs WHERE state IN ('queued', 'running')")[0]["n"])

    def stop(self) -> None:
        self._stop = True
        with self._cv:
            self._cv.notify_all()

    # -- the worker threads, one per guard --------------------------------------------------------
    def _claim(self, guard: Guard) -> sqlite3.Row | None:
        """The oldest queued job, marked running on this guard's device, in one transaction."""
        with guard.db.transaction() as c:
            row: sqlite3.Row | None = c.execute("SELECT * FROM jobs WHERE state = 'queued' ORDER BY created_at LIMIT 1").fetchone()
            if row is None:
                return None
            c.execute("UPDATE jobs SET state = 'running', started_at = ?, device = ? WHERE id = ?",
                      (time.time(), guard.device.key, row["id"]))
        return row

    def _loop(self, guard: Guard) -> None:
        while not self._stop:
            try:
                job = self._claim(guard)
                if job is None:
                    with self._cv:
                        self._cv.wait(1.0)
                    continue
                self._run(job, guard)
            except Exception:  # e.g. the database locked for longer than its timeout: keep serving
                log.exception("job loop on %s", guard.device.key)
                time.sleep(1.0)

    def _run(self, job: sqlite3.Row, guard: Guard) -> None:
        job_id = job["id"]

        def progress(phase: str, done: int, total: int, detail: str) -> None:
            self._progress[job_id] = {"phase": phase, "done": done, "total": total, "detail": detail}
            with self._cv:
                self._cv.notify_all()

        try:
            solution = Solution.model_validate(json.loads(job["solution_json"]))
            verdict = guard.evaluate(solution, job["problem"], agent=job["agent"], notes=job["notes"],
                                     parent=job["parent"], progress=progress)
            fields: dict[str, object] = {"state": "done", "candidate_id": verdict.candidate_id}
        except (GuardError, ValueError) as exc:
            log.warning("job %s failed: %s", job_id, exc)
            fields = {"state": "error", "error": str(exc)[:4000]}
        except Exception as exc:  # keep serving; the job says what went wrong
            log.exception("job %s crashed", job_id)
            fields = {"state": "error", "error": f"internal error: {type(exc).__name__}: {exc}"[:4000]}
        fields["finished_at"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in fields)
        with guard.db.transaction() as c:
            c.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*fields.values(), job_id))
        self._progress.pop(job_id, None)
        with self._cv:
            self._cv.notify_all()
