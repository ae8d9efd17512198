"""The servers that judge jobs, recorded in the workspace database, so that a job can name the
server answerable for it and a later server can tell a job whose server is gone (killed, or
crashed) from one that a live server is still judging.

A pid alone does not say a process is the same one: pids are reused. A server is recorded
with the identity of its process, the boot's id and the process's start time
(``/proc/<pid>/stat``), and it is alive while a process with that pid and that identity
exists on its host. A server of another host cannot be checked from here and counts as
alive: its jobs are left alone. Where ``/proc`` is missing, the pid alone is checked.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from ..processes import pid_exists
from .db import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS servers (
    id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    identity TEXT,                  -- boot id and start time of the process, against pid reuse
    started_at REAL NOT NULL,
    stopped_at REAL,
    stopped_by TEXT                 -- what stopped it: 'stdin closed', 'SIGTERM', 'found dead' ...
);
"""


def process_identity(pid: int) -> str | None:
    """The boot's id and the process's start time (clock ticks since boot), or None when the
    process does not exist, is a zombie, or ``/proc`` cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    if len(fields) < 20 or fields[0] in ("Z", "X"):  # state, then starttime is the 20th
        return None
    return f"{boot}:{fields[19]}"


def alive(pid: int, host: str, identity: str | None) -> bool:
    """Whether the server recorded with ``pid``, ``host`` and ``identity`` still runs."""
    if host != socket.gethostname():
        return True  # cannot be checked from here
    if identity is not None and os.path.exists("/proc/self/stat"):
        return process_identity(pid) == identity
    return pid_exists(pid)


class Servers:
    def __init__(self, db: Database):
        self.db = db
        db.reader().executescript(SCHEMA)

    def register(self) -> str:
        """This process, as a server that judges jobs; returns its id."""
        sid = "s-" + uuid.uuid4().hex[:12]
        pid = os.getpid()
        with self.db.transaction() as c:
            c.execute(
                "INSERT INTO servers (id, pid, host, identity, started_at) VALUES (?,?,?,?,?)",
                (sid, pid, socket.gethostname(), process_identity(pid), time.time()),
            )
        return sid

    @staticmethod
    def mark_stopped(c: sqlite3.Connection, sid: str, stopped_by: str) -> None:
        """Inside the caller's transaction."""
        c.execute(
            "UPDATE servers SET stopped_at = ?, stopped_by = ? WHERE id = ? AND stopped_at IS NULL",
            (time.time(), stopped_by, sid),
        )

    def gone(self, ids: Iterable[str]) -> dict[str, int | None]:
        """Of the servers ``ids``, those that no longer run (stopped, dead, or never recorded),
        with their pid (None when unknown)."""
        out: dict[str, int | None] = {}
        for sid in ids:
            rows = self.db.query("SELECT pid, host, identity, stopped_at FROM servers WHERE id = ?", (sid,))
            if not rows:
                out[sid] = None
                continue
            r = rows[0]
            if r["stopped_at"] is not None or not alive(r["pid"], r["host"], r["identity"]):
                out[sid] = int(r["pid"])
        return out
