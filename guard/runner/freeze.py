"""Stopping a worker's whole process tree while another worker measures something that it
must not disturb (the loop cost for the outside clock): a stopped process cannot submit GPU
work or burn CPU from a thread it left running."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
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
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


@contextlib.contextmanager
def frozen(pid: int | None) -> Iterator[list[int]]:
    """SIGSTOP ``pid``'s tree for the duration of the block, SIGCONT after."""
    stopped: list[int] = []
    if pid is not None:
        for p in descendants(pid):
            try:
                os.kill(p, signal.SIGSTOP)
                stopped.append(p)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        yield stopped
    finally:
        for p in reversed(stopped):
            try:
                os.kill(p, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
