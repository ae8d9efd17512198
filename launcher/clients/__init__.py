"""Agent clients behind one interface: Claude Code, Codex, and the built-in scripted agent."""

from __future__ import annotations

from .base import AgentClient, AgentContext, Launch
from .claude import ClaudeClient
from .codex import CodexClient
from .scripted import ScriptedClient

_CLIENTS: dict[str, type] = {"claude": ClaudeClient, "codex": CodexClient, "scripted": ScriptedClient}


def get_client(name: str) -> AgentClient:
    try:
        return _CLIENTS[name]()
    except KeyError:
        raise ValueError(f"unknown client {name!r}: claude, codex or scripted") from None


__all__ = ["AgentClient", "AgentContext", "Launch", "get_client"]
