"""The guard's side of a CPU window's staged inputs (``runner/staged.py`` says why): the
candidate's worker names a buffer per input per call, the trusted worker draws the inputs and
names buffers of its own for them, and the guard checks each side's buffers against the drawn
tensors. The inputs are then written call by call as the window goes (``paced_calls``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..runner import messages as m
from ..runner.peek import PeekError, contiguous_strides, process_with_ns_pid
from ..runner.process import WorkerProcess
from .reasons import GuardError, Rejection
from .workload_requests import WorkloadContext, call, failure

# one input of one call: (address in the worker, offset in the drawn bytes, bytes)
Write = tuple[int, int, int]


@dataclass(frozen=True)
class Staging:
    """One window's inputs, drawn and checked: every call's inputs as bytes, and per call what
    to write of them where, in the candidate's worker (its process the one its set-up named) and
    in the trusted one (numbered as its own PID namespace numbers it)."""

    data: bytes
    candidate: list[list[Write]]
    trusted_pid: int
    trusted: list[list[Write]]


def stage(cx: WorkloadContext, seed: int, iters: int, tag: str, copies: bool, projection_seed: int) -> Staging:
    """Buffers for ``iters`` calls in both workers and the inputs drawn from ``seed`` by the
    trusted one (``copies``, ``projection_seed``: as the trusted loop's requests name its loop,
    so that all of them share it)."""
    w = cx.w
    where = call(cx.worker, m.StageInputs(iters=iters), m.StageReply, cx.timeout)
    if not where.ok:
        raise failure(where, w, "staging the inputs of the outside clock's loop on")
    folder = cx.trusted.workdir / "staged"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{tag}.bin"
    try:
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
        data = path.read_bytes()
    finally:
        path.unlink(missing_ok=True)

    def refuse(why: str) -> Exception:
        return Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the candidate's worker described the buffers for the inputs of the outside clock's loop on "
            f"{w.uuid} wrongly: {why}",
            None,
            w.uuid,
        )

    def own_fault(why: str) -> Exception:
        return GuardError(f"the trusted worker's buffers for the inputs of {w.uuid}: {why}")

    return Staging(
        data,
        planned_writes(where.inputs, drawn.tensors, iters, refuse),
        drawn.pid,
        planned_writes(drawn.buffers, drawn.tensors, iters, own_fault),
    )


def before_window(writes: list[list[Write]], paced: bool) -> list[Write]:
    """What is written before a window starts: call 0's inputs where the window is paced (each
    next call's come once the one before it is done), else every call's."""
    return [x for row in writes[: 1 if paced else len(writes)] for x in row]


def planned_writes(
    buffers: list[list[m.HeldOutput | None]],
    drawn: list[list[m.DrawnTensor | None]],
    iters: int,
    refuse: Callable[[str], Exception],
) -> list[list[Write]]:
    """Per call, each drawn input matched to the buffer a worker named for it. A buffer that is
    not a contiguous tensor of the input's shape and dtype, or that overlaps another (every
    call's inputs must be its own: one buffer named for all calls would leave them the last
    call's inputs), is refused (``refuse``: the candidate's doing, REWARD_HACK)."""
    if len(drawn) != iters:
        raise GuardError(f"the trusted worker drew {len(drawn)} calls' inputs for {iters}")
    if len(buffers) != iters:
        raise refuse(f"{len(buffers)} calls' buffers for {iters}")
    writes: list[list[Write]] = []
    for i, (named, inputs) in enumerate(zip(buffers, drawn)):
        if len(named) != len(inputs):
            raise refuse(f"call {i} has {len(named)} arguments, the definition {len(inputs)}")
        row: list[Write] = []
        for j, (b, t) in enumerate(zip(named, inputs)):
            if t is None:
                continue  # not a tensor: nothing to write
            if b is None:
                raise refuse(f"no buffer for argument {j} of call {i}")
            if b.shape != t.shape or b.dtype != t.dtype:
                raise refuse(f"argument {j} of call {i} as {b.dtype} {b.shape}, drawn as {t.dtype} {t.shape}")
            if b.stride != contiguous_strides(b.shape) and t.nbytes > 0:
                raise refuse(f"argument {j} of call {i} with strides {b.stride}, not contiguous")
            if t.nbytes > 0:
                row.append((b.address, t.offset, t.nbytes))
        writes.append(row)
    ranges = sorted((address, address + nbytes) for row in writes for address, _, nbytes in row)
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        if start < end:
            raise refuse(f"two buffers overlap at {start:#x}")
    return writes


def worker_process(worker: WorkerProcess, ns_pid: int | None = None) -> int:
    """The host's pid of the process that ``worker``'s PID namespace numbers ``ns_pid``; by
    default the worker's own, as its set-up named it before any candidate code ran
    (``WorkerProcess.ns_pid``: a candidate's later word for it once named a dead child)."""
    ns = worker.ns_pid if ns_pid is None else ns_pid
    if ns is None:
        raise GuardError(f"the {worker.role} worker's set-up did not say its process")
    root = worker.sandbox_pid
    if root is None:
        raise PeekError(f"the {worker.role} worker has ended")
    return process_with_ns_pid(root, ns)
