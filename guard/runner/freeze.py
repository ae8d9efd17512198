"""Stopping a worker's whole process tree while another worker measures something that it
must not disturb (the loop cost for the outside clock): a stopped process cannot submit GPU
work or burn CPU from a thread it left running."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from /proc (parent links of every process)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: fields follow the last ')'
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _state(pid: int) -> str:
    """The process's state letter from /proc (R, S, T...), or "X" when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] if fields else "X"


def _wait_stopped(pids: list[int], timeout_s: float = 1.0) -> None:
    """SIGSTOP is delivered asynchronously: a process can still run for a moment after the
    signal is sent. Wait until every one is seen stopped (or gone), up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pending = list(pids)
    while pending:
        pending = [p for p in pending if _state(p) not in ("T", "t", "Z", "X")]
        if not pending:
            return
        if time.monotonic() > deadline:
            log.warning("processes %s not seen stopped within %.1f s", pending, timeout_s)
            return
        time.sleep(0.001)


@contextlib.contextmanager
def frozen(pid: int | None) -> Iterator[list[int]]:
    """SIGSTOP ``pid``'s tree for the duration of the block (every process seen stopped
    before it starts), SIGCONT after."""
    stopped: list[int] = []
    if pid is not None:
        for p in descendants(pid):
            try:
                os.kill(p, signal.SIGSTOP)
                stopped.append(p)
            except (ProcessLookupError, PermissionError):
                pass
        _wait_stopped(stopped)
    try:
        yield stopped
    finally:
        for p in reversed(stopped):
            try:
                os.kill(p, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
