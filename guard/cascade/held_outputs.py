"""The guard's side of a CPU's outside-clock loop whose outputs stay in the candidate's worker
(``runner/kept.py``): how many calls a loop may hold, and reading a checked call's outputs out
of the worker (``runner/peek.py``) as soon as the call is done (``runner/pacing.py``) for the
trusted worker to check."""

from __future__ import annotations

import math
from pathlib import Path

from ..problems.dtypes import dtype_info
from ..problems.schema import Definition, Workload
from ..runner import messages as m
from ..runner import reuse
from ..runner.peek import PeekError, read_held
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


def timed_calls_capped(timing: m.TimingConfig, d: Definition, w: Workload, max_bytes: int) -> m.TimingConfig:
    """A CPU's timed loop holds every call's outputs until the guard has read the ones it
    checks: at most as many calls as fit in ``max_bytes`` (``MIN_HELD_CALLS`` at least), so the
    plan's bounds, which the guard checks the plan against, come down to that."""
    out_bytes = tensor_bytes(d, w)[1]
    fit = max(MIN_HELD_CALLS, max_bytes // out_bytes) if out_bytes > 0 else timing.max_iters
    if fit >= timing.max_iters:
        return timing
    return timing.model_copy(update={"min_iters": min(timing.min_iters, fit), "max_iters": fit})


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


def expected_outputs(d: Definition, w: Workload) -> list[tuple[list[int], str]]:
    """Per output of one call on ``w``: the definition's shape and dtype."""
    axes = d.resolve_axes(w.axes)
    return [(list(d.shape_of(spec, axes)), spec.dtype) for spec in d.outputs.values()]


def output_ndims(expected: list[tuple[list[int], str]]) -> list[int]:
    """Per output of ``expected_outputs``: its rank, as a DONE payload describes it."""
    return [len(shape) for shape, _ in expected]


def read_call(
    pid: int,
    outputs: list[tuple[int, list[int]]],
    expected: list[tuple[list[int], str]],
    dest: Path,
    tag: str,
    w: Workload,
) -> list[m.ReadOutput | None]:
    """One call's outputs, where its DONE said they lie (``runner/pacing.py``), read out of the
    worker ``pid`` into files in ``dest`` for the trusted worker to check."""
    return read_or_accuse(pid, described(outputs, expected), expected, dest, tag, w, "the outside clock's loop")


def read_or_accuse(
    pid: int,
    held: list[m.HeldOutput | None],
    expected: list[tuple[list[int], str]],
    dest: Path,
    tag: str,
    w: Workload,
    loop: str,
    rows: bool = True,
) -> list[m.ReadOutput | None]:
    """``peek.read_held``, where a description that cannot be read as it says is REWARD_HACK:
    the worker's process chose it. ``loop``: whose outputs, for the reason."""
    try:
        return read_held(pid, held, expected, dest, tag, rows)
    except PeekError as exc:
        raise accused(w, loop, exc) from None


def accused(w: Workload, loop: str, exc: PeekError) -> Rejection:
    """REWARD_HACK for a description of ``loop``'s outputs that could not be read as it said."""
    return Rejection(
        "benchmark",
        "REWARD_HACK",
        f"the candidate's worker described the outputs of {loop} on {w.uuid} as memory that does not hold them: {exc}",
        None,
        w.uuid,
    )


def described(outputs: list[tuple[int, list[int]]], expected: list[tuple[list[int], str]]) -> list[m.HeldOutput | None]:
    """A DONE's outputs as the descriptions ``peek.read_held`` reads (None: not a tensor)."""
    return [
        m.HeldOutput(address=address, shape=shape, stride=strides, dtype=dtype)
        # an empty tensor may lie at address 0 (no memory): nothing is read of it
        if (0 < address or (address == 0 and 0 in shape))
        and address < m.MEMORY_LIMIT
        and all(0 <= s < m.MEMORY_LIMIT for s in strides)
        else None
        for (address, strides), (shape, dtype) in zip(outputs, expected)
    ]


def returned_again(
    calls: list[tuple[int, list[tuple[int, list[int]]]]], expected: list[tuple[list[int], str]]
) -> tuple[int, int, int] | None:
    """(earlier call, later call, the later call's output) where a call of one loop described an
    output in elements an earlier call's outputs were described in (``runner/reuse.py``), or
    None. A CPU's loop holds every call's outputs where the call left them (``runner/confirm.py``),
    so only a kernel that reuses a buffer lands there. The correctness gate names the same of
    the rounds it holds; a kernel alternating buffers over more rounds than a check holds got
    here, where its read call held a later call's answer, and was REWARD_HACK, and so did one
    keeping a strided buffer while only dense outputs were compared (red team, session 49).
    ``calls``: each call's index and its DONE's outputs; what ``described`` refuses, and an
    output of a dtype that is not whole bytes, is not looked at (the read of a checked call
    refuses it)."""
    return reuse.first_reuse(
        [(i, [_held_layout(held) for held in described(outputs, expected)]) for i, outputs in calls]
    )


def _held_layout(held: m.HeldOutput | None) -> reuse.Layout | None:
    """A description's layout, for ``reuse.first_reuse``; None for none, or a dtype of less than
    a byte."""
    if held is None or (size := dtype_info(held.dtype).bytes) != int(size):
        return None
    return held.address, held.shape, held.stride, int(size)
