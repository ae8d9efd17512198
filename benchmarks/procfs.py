"""Processes and TCP sockets read from Linux's /proc, for the load benchmark and the tests
that look at which server process holds which connection."""

from __future__ import annotations

import os
from pathlib import Path

LISTEN, ESTABLISHED = "0A", "01"  # socket states in /proc/net/tcp


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name: [0] state, [1] parent pid,
    [11] user and [12] system CPU ticks, [19] start time; None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def descendants(root: int) -> dict[int, str]:
    """Every process below ``root``, with its start time (to tell it from a later process
    that reuses its pid)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (f := stat_fields(int(entry))) is not None:
            parent[int(entry)] = int(f[1])
    found: dict[int, str] = {}
    frontier = {root}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier and pid not in found}
        for pid in frontier:
            if (f := stat_fields(pid)) is not None:
                found[pid] = f[19]
    return found


def cpu_seconds(pid: int) -> float | None:
    f = stat_fields(pid)
    return None if f is None else (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets a process holds open."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def tcp_sockets(port: int, state: str) -> dict[str, int]:
    """The TCP sockets whose local port is ``port``, in ``state``: inode -> remote port."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if f[3] == state and int(f[1].rsplit(":", 1)[1], 16) == port:
                out[f[9]] = int(f[2].rsplit(":", 1)[1], 16)
    return out


def process_roles(root: int) -> dict[int, str]:
    """The server process ``root`` and its descendants, each with its role (empty where there
    is no /proc): the HTTP workers are its direct children started through spawn."""
    if not os.path.isdir("/proc"):
        return {}
    roles = {}
    for pid in {root, *descendants(root)}:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pid == root:
            roles[pid] = "serve (evaluates)"
        elif "worker_main" in cmd:
            roles[pid] = "guard worker"
        elif "resource_tracker" in cmd:
            roles[pid] = "resource tracker"
        elif "spawn_main" in cmd and (f := stat_fields(pid)) is not None and int(f[1]) == root:
            roles[pid] = "http worker"
        else:
            roles[pid] = "other"  # a compiler, a build step, ...
    return roles
