"""The guard's side of a CPU window's staged inputs (``runner/staged.py`` says why): the
candidate's worker names a buffer per input per call, the trusted worker draws the inputs
into a file, and the guard checks the one against the other and writes the file into the
candidate's stopped worker (``runner/poke.py``) just before its clock starts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..problems.schema import Workload
from ..runner import messages as m
from ..runner.peek import PeekError, contiguous_strides, process_with_ns_pid
from ..runner.poke import write_into
from .reasons import GuardError, Rejection
from .workload_requests import WorkloadContext, call, failure


@dataclass(frozen=True)
class Staging:
    """One window's inputs, drawn and checked: the file, and each ``(address, offset, nbytes)``
    to write from it into the process that the candidate's PID namespace numbers ``pid``."""

    pid: int
    path: Path
    writes: list[tuple[int, int, int]]


def stage(cx: WorkloadContext, seed: int, iters: int, tag: str, copies: bool, projection_seed: int) -> Staging:
    """Buffers for ``iters`` calls in the candidate's worker and the inputs drawn from ``seed``
    in the trusted one (``copies``, ``projection_seed``: as the trusted loop's requests name
    its loop, so that all of them share it)."""
    w = cx.w
    where = call(cx.worker, m.StageInputs(iters=iters), m.StageReply, cx.timeout)
    if not where.ok:
        raise failure(where, w, "staging the inputs of the outside clock's loop on")
    folder = cx.trusted.workdir / "staged"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{tag}.bin"
    drawn = call(
        cx.trusted,
        m.DrawInputs(
            **cx.trusted_fields(),
            seed=seed,
            iters=iters,
            copies=copies,
            projection_seed=projection_seed,
            path=str(path),
        ),
        m.DrawnReply,
        cx.timeout,
    )
    if not drawn.ok:
        raise GuardError(f"the trusted worker could not draw the inputs of {w.uuid}: {drawn.message}")
    try:
        return Staging(where.pid, path, planned_writes(where.inputs, drawn.tensors, iters, w))
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def planned_writes(
    buffers: list[list[m.HeldOutput | None]], drawn: list[list[m.DrawnTensor | None]], iters: int, w: Workload
) -> list[tuple[int, int, int]]:
    """Each drawn input matched to the buffer the candidate's worker named for it. A buffer
    that is not a contiguous tensor of the input's shape and dtype, or that overlaps another
    (every call's inputs must be its own: one buffer named for all calls would leave them the
    last call's inputs), is REWARD_HACK: the worker's process chose it."""

    def refuse(why: str) -> Rejection:
        return Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the candidate's worker described the buffers for the inputs of the outside clock's loop on "
            f"{w.uuid} wrongly: {why}",
            None,
            w.uuid,
        )

    if len(drawn) != iters:
        raise GuardError(f"the trusted worker drew {len(drawn)} calls' inputs for {iters}")
    if len(buffers) != iters:
        raise refuse(f"{len(buffers)} calls' buffers for {iters}")
    writes: list[tuple[int, int, int]] = []
    for i, (named, inputs) in enumerate(zip(buffers, drawn)):
        if len(named) != len(inputs):
            raise refuse(f"call {i} has {len(named)} arguments, the definition {len(inputs)}")
        for j, (b, t) in enumerate(zip(named, inputs)):
            if t is None:
                continue  # not a tensor: nothing to write
            if b is None:
                raise refuse(f"no buffer for argument {j} of call {i}")
            if b.shape != t.shape or b.dtype != t.dtype:
                raise refuse(f"argument {j} of call {i} as {b.dtype} {b.shape}, drawn as {t.dtype} {t.shape}")
            if b.stride != contiguous_strides(b.shape) and math.prod(b.shape) > 1:
                raise refuse(f"argument {j} of call {i} with strides {b.stride}, not contiguous")
            if t.nbytes > 0:
                writes.append((b.address, t.offset, t.nbytes))
    ranges = sorted((address, address + nbytes) for address, _, nbytes in writes)
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        if start < end:
            raise refuse(f"two buffers overlap at {start:#x}")
    return writes


def write(cx: WorkloadContext, staging: Staging) -> None:
    """The window's inputs into the candidate's worker, which must be stopped; the file goes."""
    w = cx.w
    try:
        root = cx.worker.sandbox_pid
        if root is None:
            raise PeekError("the candidate's worker has ended")
        write_into(process_with_ns_pid(root, staging.pid), staging.path, staging.writes)
    except PeekError as exc:
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the candidate's worker described the buffers for the inputs of the outside clock's loop on "
            f"{w.uuid} as memory that cannot take them: {exc}",
            None,
            w.uuid,
        ) from None
    finally:
        staging.path.unlink(missing_ok=True)
