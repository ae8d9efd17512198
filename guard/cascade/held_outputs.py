"""The guard's side of a CPU's outside-clock loop whose outputs stay in the candidate's worker
(``runner/kept.py``): how many calls a loop may hold, and reading the chosen calls' outputs
out of the stopped worker (``runner/peek.py``) for the trusted worker to check."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from ..problems.schema import Definition, Workload
from ..runner import messages as m
from ..runner.peek import PeekError, process_with_ns_pid, read_held
from ..runner.process import WorkerProcess
from .memory_plan import tensor_bytes
from .reasons import Rejection

MIN_HELD_CALLS = 2


def held_calls(d: Definition, w: Workload, max_bytes: int, max_calls: int) -> int:
    """The most calls of one loop whose inputs (a set per call, ``runner/staged.py``) and held
    outputs fit in ``max_bytes``, ``max_calls`` at most (two at least: a call that large takes
    long enough for the guard's clock to resolve it)."""
    call_bytes = sum(tensor_bytes(d, w))
    fit = max_bytes // call_bytes if call_bytes > 0 else max_calls
    return max(MIN_HELD_CALLS, min(max_calls, fit))


def calls_for_window(calls: int, wall_s: float, target_s: float, most: int) -> int:
    """Calls per window for a window of ``target_s`` (with a fifth to spare), from a window of
    ``calls`` that took ``wall_s``: never fewer, at most ``most``."""
    if wall_s >= target_s or calls >= most:
        return calls
    return min(most, max(calls, math.ceil(calls * 1.2 * target_s / max(wall_s, 1e-6))))


def longer_windows(calls: int, shortest_s: float, outside_ms: float, target_s: float, most: int) -> int | None:
    """The calls per window to run the windows again with, or None when those run stand. Again
    when the windows came out shorter than half the target (the probe that set the calls ran
    slower than they did: a candidate that slowed it would get short windows, whose fixed cost
    is noise it could gain from), with as many calls as the shortest says; and when the calls
    were lost in the windows' noise (a figure of zero or less after every window, where a
    forged median would stand), with four times as many. At most ``most``."""
    if calls >= most:
        return None
    if shortest_s < target_s / 2:
        return calls_for_window(calls, shortest_s, target_s, most)
    if outside_ms <= 0:
        return min(most, 4 * calls)
    return None


def read_chosen(
    worker: WorkerProcess,
    reply: m.ConfirmReply,
    chosen: list[int],
    d: Definition,
    w: Workload,
    dest: Path,
) -> list[list[m.ReadOutput | None]]:
    """The outputs of the ``chosen`` calls, read from the candidate's worker (which must be
    stopped) into files in ``dest`` (a fresh folder the trusted worker reads). A description
    that cannot be read as it says is REWARD_HACK: the worker's process chose it."""
    if worker.proc is None:
        raise RuntimeError("the candidate's worker is not running")
    axes = d.resolve_axes(w.axes)
    expected = [(list(d.shape_of(spec, axes)), spec.dtype) for spec in d.outputs.values()]
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    try:
        root = worker.sandbox_pid
        if root is None:
            raise PeekError("the candidate's worker has ended")
        pid = process_with_ns_pid(root, reply.pid)
        return [read_held(pid, reply.held[i], expected, dest, f"call{i}") for i in chosen]
    except PeekError as exc:
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the candidate's worker described the outputs of the outside clock's loop on {w.uuid} "
            f"as memory that does not hold them: {exc}",
            None,
            w.uuid,
        ) from None
