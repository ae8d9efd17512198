"""The guard's side of a paced CPU window (``runner/pacing.py`` says why): with the loop's
request sent, for each call the worker's DONE, the outputs of a checked call read out of its
memory at once, the next call's inputs written into it, GO. The candidate's window and the
trusted one run through the same code, so the handshakes, writes and reads cost both alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..runner.pacing import payload_size, unpack
from ..runner.poke import Memory
from ..runner.process import WorkerProcess
from .staged_inputs import Write


def run(
    worker: WorkerProcess,
    memory: Memory,
    data: bytes,
    writes: list[list[Write]],
    ndims: list[int],
    on_done: Callable[[int, list[tuple[int, list[int]]]], None],
    deadline: float,
) -> tuple[int, dict[str, Any] | None]:
    """The calls of a paced loop whose request is outstanding, call 0's inputs written already:
    (the calls that said DONE, the request's reply where it came before the last DONE: the
    loop failed or ended short, else None). ``on_done(i, outputs)``: call ``i`` is done, its
    outputs where ``outputs`` says; the next inputs are written after it returns."""
    size = payload_size(ndims)
    n = len(writes)
    for i in range(n):
        got = worker.pace_done(size, deadline)
        if isinstance(got, dict):
            return i, got
        on_done(i, unpack(got, ndims))
        if i + 1 < n:
            memory.write(data, writes[i + 1])
            worker.pace_go()
    return n, None


def remaining(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())
