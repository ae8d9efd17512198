"""A queue of evaluations in front of one Guard, kept in the workspace database.

Every job names the server answerable for it (``server``, a row of ``guard/archive/servers.py``):
while queued, the evaluating server it was submitted to; once running, the one judging it.
A server that stops leaves none of its jobs behind:

- on a clean stop (stdin closed, SIGTERM, SIGINT, SIGHUP, ``close``) the job it is judging
  becomes ``interrupted`` and the jobs queued through it ``cancelled``, each with a reason that
  says the server stopped and to resubmit; the candidate being judged is marked
  ``interrupted`` too, whatever its workers, killed by the stop, made it look like;
- a server that was killed (SIGKILL) or crashed cannot say so: the next server (at its start,
  then every few seconds) finds its jobs by its pid and process start time and does the same,
  with a reason that says so.

So nothing waits behind jobs whose server is gone, and an agent asking about its job (from
any server of the workspace) learns what became of it. A server of another host cannot be
checked from here: its jobs are left alone.

Submitting returns at once with a job id; ``wait`` blocks for a bounded time (MCP clients
give up on a tool call after about 60 s) and reports progress while it waits.

With several guards (one per GPU of the host) each has its own thread; a thread claims the
oldest queued job in one transaction, so no job runs twice, and the job records the device
that judged it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .archive.db import RESULT_COLUMNS
from .archive.servers import Servers
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
    state TEXT NOT NULL,            -- queued, running, done, error, interrupted, cancelled
    candidate_id TEXT,
    error TEXT,                     -- why there is no verdict (error, interrupted, cancelled)
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    device TEXT,                    -- the device (physical key) that judged it
    server TEXT,                    -- its server: the one it was queued through, then the one judging it
    stored_bytes INTEGER            -- its solution's and notes' bytes, counted against its agent's limit
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, created_at);
"""
# covering: an agent's total is read from the index, never from rows whose solutions span pages
STORED_INDEX = "CREATE INDEX IF NOT EXISTS jobs_agent_bytes ON jobs(agent, stored_bytes)"

# a job in one of these states will not change again
FINAL = ("done", "error", "interrupted", "cancelled")
UNFINISHED = ("queued", "running")
SWEEP_S = 5.0  # how often a server looks for jobs of servers that are gone
SETTLE_S = 5.0  # how long a stopping server waits for its job threads to end


class Stopping(Exception):
    """Raised at an evaluation's next step once its server is stopping."""


class StorageSpent(Exception):
    """An agent's submissions take what the workspace gives one agent."""


class TooManyJobs(Exception):
    """An agent already has as many jobs waiting or being judged as it may."""


def _stopped_reasons(why: str) -> tuple[str, str]:
    """What a running and a queued job say when their server stopped cleanly."""
    return (
        f"the server stopped ({why}) while judging it; resubmit to judge",
        f"the server stopped ({why}) before judging it; resubmit to judge",
    )


def _gone_reasons(pid: int | None) -> tuple[str, str]:
    """What a running and a queued job say when their server is found gone."""
    who = f"the server (pid {pid})" if pid else "the server"
    return (
        f"{who} ended while judging it, without a clean stop (killed or crashed); resubmit to judge",
        f"{who} ended before judging it, without a clean stop (killed or crashed); resubmit to judge",
    )


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
    def __init__(
        self, guards: Guard | Sequence[Guard], autostart: bool = True, evaluator: bool = True, server: str | None = None
    ):
        """``evaluator``: this process judges jobs: it is recorded as a server, resolves the jobs
        of servers that are gone, and resolves its own when it stops. Otherwise it only queues,
        for the evaluating ``server`` (an HTTP worker's parent), or for any server when None."""
        self.guards = [guards] if isinstance(guards, Guard) else list(guards)
        if not self.guards:
            raise ValueError("a job queue needs at least one guard")
        if len({g.device.key for g in self.guards}) != len(self.guards):
            raise ValueError("two guards on one device would share its timing slot: one guard per device")
        self.guard = self.guards[0]  # problems and configuration are the same for all
        self.db = self.guard.db
        self.db.reader().executescript(SCHEMA)
        have = {r[1] for r in self.db.reader().execute("PRAGMA table_info(jobs)")}
        for column in ("device", "server"):
            if column not in have:
                self.db.reader().execute(f"ALTER TABLE jobs ADD COLUMN {column} TEXT")
        if "stored_bytes" not in have:  # a workspace from before the limit: its jobs counted once
            with self.db.transaction() as c:  # read again inside: another process may have added it
                if "stored_bytes" not in {r[1] for r in c.execute("PRAGMA table_info(jobs)")}:
                    c.execute("ALTER TABLE jobs ADD COLUMN stored_bytes INTEGER")
                    c.execute(
                        "UPDATE jobs SET stored_bytes = LENGTH(CAST(solution_json AS BLOB))"
                        " + COALESCE(LENGTH(CAST(notes AS BLOB)), 0)"
                    )
        self.db.reader().execute(STORED_INDEX)
        self.evaluator = evaluator
        self.servers = Servers(self.db)
        self.server = self.servers.register() if evaluator else server
        self._cv = threading.Condition()
        self._progress: dict[str, dict[str, Any]] = {}
        self._stop = False
        self._stopped: tuple[float, str, list[dict[str, Any]]] | None = None  # when, why, the jobs it interrupted
        self._swept = 0.0
        self._sweep_lock = threading.Lock()
        if evaluator:
            self.sweep()  # before any claim: nothing of a server that is gone runs here
        self._threads = [
            threading.Thread(target=self._loop, args=(g,), name=f"kernelarc-jobs-{i}", daemon=True)
            for i, g in enumerate(self.guards)
        ]
        if autostart:
            for t in self._threads:
                t.start()

    # -- API ---------------------------------------------------------------------------------
    def submit(
        self, agent: str, problem: str, solution: Solution, notes: str | None = None, parent: str | None = None
    ) -> str:
        self.guard.store.get(problem)  # unknown problem: fail now, not in the queue
        if self._stop:
            raise Stopping("the server is stopping: submit again to the next one")
        job_id = "j-" + uuid.uuid4().hex[:12]
        cfg = self.guard.cfg
        payload = solution.model_dump_json(exclude_none=True)
        size = len(payload.encode()) + len((notes or "").encode())
        with self.db.transaction() as c:
            (pending,) = c.execute(
                f"SELECT COUNT(*) FROM jobs WHERE agent = ? AND state IN {UNFINISHED!r}", (agent,)
            ).fetchone()
            if pending >= cfg.max_queued_per_agent:
                raise TooManyJobs(
                    f"you have {pending} evaluation(s) waiting or being judged, the most one agent may "
                    f"have (max_queued_per_agent = {cfg.max_queued_per_agent}): get_result for one, then "
                    "submit again"
                )
            (stored,) = c.execute(
                "SELECT COALESCE(SUM(stored_bytes), 0) FROM jobs INDEXED BY jobs_agent_bytes WHERE agent = ?",
                (agent,),
            ).fetchone()
            if stored + size > cfg.max_stored_bytes_per_agent:
                raise StorageSpent(
                    f"your submissions take {stored} bytes of the workspace, and this one {size} more: "
                    f"beyond what one agent may store (max_stored_bytes_per_agent = "
                    f"{cfg.max_stored_bytes_per_agent}, in the workspace's config.json); the guard judges "
                    "nothing more of yours"
                )
            c.execute(
                "INSERT INTO jobs (id, agent, problem, solution_json, notes, parent, state, created_at, server,"
                " stored_bytes) VALUES (?,?,?,?,?,?, 'queued', ?, ?, ?)",
                (job_id, agent, problem, payload, notes, parent, time.time(), self.server, size),
            )
        with self._cv:
            self._cv.notify_all()
        return job_id

    def get(self, job_id: str) -> JobView | None:
        rows = self.db.query("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        r = rows[0]
        view = JobView(r["id"], r["agent"], r["problem"], r["state"], r["candidate_id"], r["error"], device=r["device"])
        if r["state"] == "queued":
            view.position = int(
                self.db.query(
                    "SELECT COUNT(*) AS n FROM jobs WHERE state IN ('queued', 'running') AND created_at < ?",
                    (r["created_at"],),
                )[0]["n"]
            )
        view.progress = dict(self._progress.get(job_id, {}))
        if r["state"] == "done" and r["candidate_id"]:
            cand = self.db.candidate(r["candidate_id"])
            if cand is not None and cand["verdict_json"]:
                view.verdict = Verdict.model_validate_json(cand["verdict_json"])
        return view

    def wait(
        self, job_id: str, timeout: float, on_progress: Callable[[dict[str, Any]], None] | None = None
    ) -> JobView | None:
        """Block until the job is final (done, error, interrupted, cancelled) or ``timeout``
        passes; ``on_progress`` sees each change of the progress while waiting."""
        deadline = time.monotonic() + max(0.0, timeout)
        last = None
        while True:
            view = self.get(job_id)
            if view is None or view.state in FINAL:
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

    def sweep(self) -> int:
        """Resolve the unfinished jobs of servers that are gone (killed, crashed, or stopped
        without resolving them): running ones become interrupted, queued ones cancelled. Also
        the jobs an earlier version left running without a server. Returns how many."""
        with self._sweep_lock:
            self._swept = time.monotonic()
            rows = self.db.query("SELECT DISTINCT server, state FROM jobs WHERE state IN ('queued', 'running')")
            ids = {r["server"] for r in rows if r["server"] and r["server"] != self.server}
            gone = self.servers.gone(sorted(ids))
            orphans = any(r["server"] is None and r["state"] == "running" for r in rows)
            if not gone and not orphans:  # the usual case: no write
                return 0
            now = time.time()
            n = 0
            with self.db.transaction() as c:
                for sid, pid in gone.items():
                    running, queued = _gone_reasons(pid)
                    n += c.execute(
                        "UPDATE jobs SET state = 'interrupted', error = ?, finished_at = ?"
                        " WHERE server = ? AND state = 'running'",
                        (running, now, sid),
                    ).rowcount
                    n += c.execute(
                        "UPDATE jobs SET state = 'cancelled', error = ?, finished_at = ?"
                        " WHERE server = ? AND state = 'queued'",
                        (queued, now, sid),
                    ).rowcount
                    self.servers.mark_stopped(c, sid, "found dead")
                n += c.execute(
                    "UPDATE jobs SET state = 'interrupted', error = ?, finished_at = ?"
                    " WHERE server IS NULL AND state = 'running'",
                    (_gone_reasons(None)[0], now),
                ).rowcount
            if n:
                log.warning("%d job(s) of servers that ended without a clean stop: interrupted or cancelled", n)
            return n

    def stop(self, why: str = "closed") -> None:
        """No more claims; an evaluating server's running jobs become interrupted and the jobs
        queued through it cancelled, saying ``why`` (then close the guards, which ends the
        evaluations, and call ``settle``)."""
        self._stop = True
        with self._cv:
            self._cv.notify_all()
        if not self.evaluator or self._stopped is not None or self.server is None:
            return
        running, queued = _stopped_reasons(why)
        now = time.time()
        with self.db.transaction() as c:  # a claim is in a transaction too: it sees _stop, or is seen here
            interrupted = c.execute(
                "SELECT id, agent, problem, started_at FROM jobs WHERE server = ? AND state = 'running'", (self.server,)
            ).fetchall()
            c.execute(
                "UPDATE jobs SET state = 'interrupted', error = ?, finished_at = ?"
                " WHERE server = ? AND state = 'running'",
                (running, now, self.server),
            )
            n = c.execute(
                "UPDATE jobs SET state = 'cancelled', error = ?, finished_at = ? WHERE server = ? AND state = 'queued'",
                (queued, now, self.server),
            ).rowcount
            self.servers.mark_stopped(c, self.server, why)
        self._stopped = (now, running, [dict(r) for r in interrupted])
        if interrupted or n:
            log.info("stopping (%s): %d job(s) interrupted, %d cancelled", why, len(interrupted), n)

    def settle(self, timeout: float = SETTLE_S) -> None:
        """After ``stop`` and the guards' close: wait (bounded) for the job threads, then mark the
        candidates of the interrupted jobs ``interrupted``. Their evaluations ended when their
        workers were killed, which the guard may have recorded as the workers' failure (an
        error, or a REJECT for a candidate whose process died): not what happened."""
        if self._stopped is not None:
            _end_held_workers(self.guards)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
        if self._stopped is None:
            return
        at, reason, jobs = self._stopped
        pid, host = os.getpid(), socket.gethostname()
        with self.db.transaction() as c:
            for job in jobs:
                cleared = ", ".join(f"{k} = NULL" for k in RESULT_COLUMNS if k not in ("reason", "global_best"))
                c.execute(
                    f"UPDATE candidates SET state = 'interrupted', reason = ?, {cleared}, finished_at = ?"
                    " WHERE pid = ? AND host = ? AND agent = ? AND problem = ? AND created_at >= ?"
                    " AND (state IN ('running', 'error', 'interrupted')"
                    "      OR (state = 'done' AND decision = 'REJECT' AND finished_at >= ?))",
                    (reason, time.time(), pid, host, job["agent"], job["problem"], job["started_at"] or at, at),
                )
        self.db.close()

    # -- the worker threads, one per guard --------------------------------------------------------
    def _claim(self, guard: Guard) -> sqlite3.Row | None:
        """The oldest queued job, marked running on this guard's device, in one transaction."""
        if time.monotonic() - self._swept >= SWEEP_S:
            self.sweep()
        else:  # between sweeps, the next job's server checked: a gone server's job is not taken
            head = self.db.query("SELECT server FROM jobs WHERE state = 'queued' ORDER BY created_at LIMIT 1")
            other = head[0]["server"] if head else None
            if other not in (None, self.server) and self.servers.gone([other]):
                self.sweep()
        with guard.db.transaction() as c:
            if self._stop:
                return None
            row: sqlite3.Row | None = c.execute(
                "SELECT * FROM jobs WHERE state = 'queued' ORDER BY created_at LIMIT 1"
            ).fetchone()
            if row is None:
                return None
            c.execute(
                "UPDATE jobs SET state = 'running', started_at = ?, device = ?, server = ? WHERE id = ?",
                (time.time(), guard.device.key, self.server, row["id"]),
            )
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
                if self._stop:
                    return
                log.exception("job loop on %s", guard.device.key)
                time.sleep(1.0)

    def _run(self, job: sqlite3.Row, guard: Guard) -> None:
        job_id = job["id"]

        def progress(phase: str, done: int, total: int, detail: str) -> None:
            if self._stop:  # end the evaluation here rather than in workers killed under it
                raise Stopping("the server is stopping")
            self._progress[job_id] = {"phase": phase, "done": done, "total": total, "detail": detail}
            with self._cv:
                self._cv.notify_all()

        try:
            solution = Solution.model_validate(json.loads(job["solution_json"]))
            verdict = guard.evaluate(
                solution,
                job["problem"],
                agent=job["agent"],
                notes=job["notes"],
                parent=job["parent"],
                progress=progress,
            )
            fields: dict[str, object] = {"state": "done", "candidate_id": verdict.candidate_id}
        except Stopping:
            # the stop says what became of the job ("stopped while judging it"), in its own
            # transaction, whichever of the two comes first: an evaluation that reached its
            # next step before that transaction wrote "internal error: Stopping" over it
            if self.server is not None:
                self._progress.pop(job_id, None)
                return
            fields = {"state": "error", "error": _stopped_reasons("closed")[0]}
        except (GuardError, ValueError) as exc:
            if not self._stop:
                log.warning("job %s failed: %s", job_id, exc)
            fields = {"state": "error", "error": str(exc)[:4000]}
        except Exception as exc:  # keep serving; the job says what went wrong
            if not self._stop:
                log.exception("job %s crashed", job_id)
            fields = {"state": "error", "error": f"internal error: {type(exc).__name__}: {exc}"[:4000]}
        fields["finished_at"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in fields)
        with guard.db.transaction() as c:  # not over what a stop said of it
            c.execute(
                f"UPDATE jobs SET {sets} WHERE id = ? AND state = 'running' AND server IS ?",
                (*fields.values(), job_id, self.server),
            )
        self._progress.pop(job_id, None)
        with self._cv:
            self._cv.notify_all()


def _end_held_workers(guards: Sequence[Guard]) -> None:
    """Kill the candidate workers that evaluations still hold: a guard's close ends the workers
    its pool keeps, not the one an evaluation took, which may be in a call that lasts minutes
    (up to the call timeout). They are this process's children started in a guard's scratch
    folder, each the leader of its own process group."""
    import signal

    scratch = [str(g.scratch) for g in guards]
    me = os.getpid()
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:  # no /proc: the evaluation ends at its call's timeout
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) != me:
                continue
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except (OSError, ValueError, IndexError):
            continue
        if any(cwd == root or cwd.startswith(root + "/") for root in scratch):
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
