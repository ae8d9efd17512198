"""The guard's side of a paced CPU window (``runner/pacing.py`` says why): with the loop's
request sent, for each call the worker's DONE, the outputs of a checked call read out of its
memory at once, the next call's inputs written into it, GO. The candidate's window and the
trusted one run through the same code, so the handshakes, writes and reads cost both alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..runner import messages as m
from ..runner.pacing import payload_size, unpack
from ..runner.poke import Memory
from ..runner.process import WorkerProcess
from .asking import Asked
from .staged_inputs import Write

OnDone = Callable[[int, list[tuple[int, list[int]]]], None]


def request(
    worker: WorkerProcess,
    message: m.Confirm | m.Overhead,
    reply_type: type[m.R],
    memory: Memory,
    data: bytes,
    writes: list[list[Write]],
    ndims: list[int],
    on_done: OnDone | None,
    timeout: float,
) -> tuple[int, m.R]:
    """``message``'s loop in ``worker``, paced as ``message.paced`` says (call 0's inputs, or
    every call's unpaced, written already): (the calls done, its reply), within ``timeout``. A
    worker left inside a loop that failed half-way is killed: it waits for a GO that will not
    come, or sends DONEs that no one reads, and its next request would find it so."""
    deadline = time.monotonic() + timeout
    asked = Asked(worker, message, reply_type, "benchmark")
    done = on_done or _nothing
    try:
        calls, early = asked.during(lambda: run(worker, memory, data, writes, ndims, done, deadline, message.paced))
        reply = asked.taken(early) if early is not None else asked.reply(remaining(deadline))
    except BaseException:
        if not asked.answered:
            worker.kill()
        raise
    return calls, reply


def _nothing(i: int, outputs: list[tuple[int, list[int]]]) -> None:
    pass


def run(
    worker: WorkerProcess,
    memory: Memory,
    data: bytes,
    writes: list[list[Write]],
    ndims: list[int],
    on_done: OnDone,
    deadline: float,
    paced: bool = True,
) -> tuple[int, dict[str, Any] | None]:
    """The calls of a loop whose request is outstanding, call 0's inputs written already (every
    call's, unpaced): (the calls that said DONE, the request's reply where it came before the
    last DONE: the loop failed or ended short, else None). ``on_done(i, outputs)``: call ``i``
    is done, its outputs where ``outputs`` says; paced, the next inputs are written and GO sent
    after it returns."""
    size = payload_size(ndims)
    n = len(writes)
    for i in range(n):
        got = worker.pace_done(size, deadline)
        if isinstance(got, dict):
            return i, got
        on_done(i, unpack(got, ndims))
        if paced and i + 1 < n:
            memory.write(data, writes[i + 1])
            worker.pace_go(deadline)
    return n, None


def remaining(deadline: float) -> float:
    return max(0.001, deadline - time.monotonic())
