"""Agent identities over HTTP: one bearer token per agent, stored hashed in the workspace
database. ``kernelarc token create NAME`` prints a token once; the server maps a presented
token to its agent, never the other way round."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time

from guard.archive.db import Database

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_tokens (
    agent TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL
);
"""


def check_agent_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"invalid agent name {name!r}: letters, digits, '_', '-', '.'; at most 64")
    return name


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    def __init__(self, db: Database):
        self.db = db
        db.reader().executescript(SCHEMA)

    def create(self, agent: str, replace: bool = False) -> str:
        check_agent_name(agent)
        token = "ka_" + secrets.token_urlsafe(32)
        with self.db.transaction() as c:
            exists = c.execute("SELECT 1 FROM agent_tokens WHERE agent = ?", (agent,)).fetchone()
            if exists and not replace:
                raise ValueError(f"agent {agent!r} already has a token (use --replace to issue a new one)")
            c.execute("INSERT OR REPLACE INTO agent_tokens VALUES (?, ?, ?)", (agent, _digest(token), time.time()))
        return token

    def revoke(self, agent: str) -> bool:
        with self.db.transaction() as c:
            return c.execute("DELETE FROM agent_tokens WHERE agent = ?", (agent,)).rowcount > 0

    def agents(self) -> list[dict[str, object]]:
        return [dict(r) for r in self.db.query("SELECT agent, created_at FROM agent_tokens ORDER BY agent")]

    def agent_for(self, token: str) -> str | None:
        if not isinstance(token, str) or not token.startswith("ka_") or len(token) > 200:
            return None
        digest = _digest(token)
        rows = self.db.query("SELECT agent, token_sha256 FROM agent_tokens WHERE token_sha256 = ?", (digest,))
        if rows and hmac.compare_digest(rows[0]["token_sha256"], digest):
            return str(rows[0]["agent"])
        return None
