"""A CPU's outside-clock windows (``outside_windows.run_windows`` runs them): each window's
inputs drawn by the trusted worker and written by the guard into both workers
(``staged_inputs``), the candidate's loop timed by the guard's clock while the chosen calls'
outputs are read as each call says it is done (``paced_calls``), its charge read while its
tree is stopped, and the trusted worker's loop run the same way on the same inputs. Also the
probe that sizes a window."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from ..problems.schema import Workload
from ..runner import messages as m
from ..runner import reuse
from ..runner import tree_cpu
from ..runner.freeze import frozen
from ..runner.peek import PeekError
from ..runner.poke import Memory
from . import held_outputs, paced_calls, staged_inputs
from .reasons import GuardError, Rejection
from .workload_requests import WorkloadContext, candidate_stopped, failure, no_gc

log = logging.getLogger(__name__)
T = TypeVar("T")


def calls_per_window(
    cx: WorkloadContext, run_seed: int, calls: int, most: int, copies: bool, projection_seed: int
) -> int:
    """The calls per window of the outside clock's loop, from one loop of ``calls`` timed by the
    guard's clock (its outputs are not read: the windows that decide come after, on their own
    data). Only a loop that is slower than it need be lengthens it: a candidate gains nothing."""
    target = cx.ref.cfg.outside_window_s_cpu
    if calls >= most or target <= 0:
        return calls
    staging = staged_inputs.stage(cx, cx.ref.seed("confirm-probe", run_seed), calls, "probe", copies, projection_seed)
    ndims = held_outputs.output_ndims(held_outputs.expected_outputs(cx.d, cx.w))
    with _candidate_memory(cx, staging) as (_, memory):
        _write_stopped(cx, memory, staging, False, lambda: None)
        with no_gc():
            t0 = time.monotonic()
            _, probe = paced_calls.request(
                cx.worker,
                m.Confirm(seed=0, iters=calls),
                m.ConfirmReply,
                memory,
                staging.data,
                staging.candidate,
                ndims,
                None,
                cx.timeout,
            )
            wall = time.monotonic() - t0
    if not probe.ok:
        raise failure(probe, cx.w, "timing")
    return held_outputs.calls_for_window(calls, wall, target, most)


@dataclass
class Ran:
    """A candidate's window that has ended, not yet charged: its wall, and what was read at its
    start (the sandbox's CPU count, this thread's CPU time, its tree's reading), the chosen
    calls' outputs as read."""

    wall_s: float
    t0: float
    counted0: int | None
    mine0: float
    tree0: tree_cpu.TreeCpu
    read: list[list[m.ReadOutput | None]]
    described: list[tuple[int, list[tuple[int, list[int]]]]]


class CpuWindows:
    """One workload's CPU windows of ``n`` calls each, ``paced`` or not (``runner/pacing.py``).
    A window's staged inputs are kept for the trusted loop that follows it, and for the one
    run again on them (``outside_clock.run_windows``'s ``loop_again``)."""

    def __init__(self, cx: WorkloadContext, n: int, copies: bool, projection_seed: int, paced: bool):
        self.cx, self.n, self.copies, self.projection_seed, self.paced = cx, n, copies, projection_seed, paced
        self.expected = held_outputs.expected_outputs(cx.d, cx.w)
        self.ndims = held_outputs.output_ndims(self.expected)
        self.staging: staged_inputs.Staging | None = None
        self.run_pid = cx.worker.proc.pid if cx.worker.proc is not None else None
        # whether the last candidate's window was charged its CPU time (``charge``): its
        # trusted windows are charged the same way (``trusted_charge``)
        self.by_cpu_time = False
        self.loop_pid = cx.trusted.proc.pid if cx.trusted.proc is not None else None

    def run(self, index: int, seed: int, chosen: list[int]) -> Ran:
        """The candidate's window: the inputs written while it is stopped (every call's, or,
        paced, call 0's), its CPU time and the guard's clock read then, the chosen calls'
        outputs read out of its worker as each says it is done."""
        cx, w, n = self.cx, self.cx.w, self.n
        staging = self.staging = staged_inputs.stage(cx, seed, n, f"window{index}", self.copies, self.projection_seed)
        dest = cx.trusted.workdir / "read" / f"window{index}"
        dest.mkdir(parents=True, exist_ok=True)
        wanted = set(chosen)
        reads: dict[int, list[m.ReadOutput | None]] = {}
        described: list[tuple[int, list[tuple[int, list[int]]]]] = []  # every call's, looked at after
        with no_gc(), _candidate_memory(cx, staging) as (pid, memory):

            def on_done(i: int, outputs: list[tuple[int, list[int]]]) -> None:
                described.append((i, outputs))
                if i in wanted:  # read now, before the next call's inputs exist
                    reads[i] = held_outputs.read_call(pid, outputs, self.expected, dest, f"call{i}", w)

            tree0, counted0 = _write_stopped(
                cx, memory, staging, self.paced, lambda: (tree_cpu.read(self.run_pid), cx.worker.cpu_ns())
            )
            mine0 = time.thread_time()
            t0 = time.monotonic()
            # a CPU's loop draws nothing: its seed is the guard's alone
            confirm = m.Confirm(seed=0, iters=n, copies=self.copies, paced=self.paced)
            calls, confirmed = paced_calls.request(
                cx.worker,
                confirm,
                m.ConfirmReply,
                memory,
                staging.data,
                staging.candidate,
                self.ndims,
                on_done,
                cx.timeout,
            )
            wall = time.monotonic() - t0
        if not confirmed.ok:
            raise failure(confirmed, w, "timing")
        if calls != n:
            raise Rejection(
                "benchmark",
                "REWARD_HACK",
                f"the outside clock's loop on {w.uuid} ended after {calls} calls of {n}",
                None,
                w.uuid,
            )
        return Ran(wall, t0, counted0, mine0, tree0, [reads[i] for i in chosen], described)

    def reject_reuse(self, ran: Ran) -> None:
        """INCORRECT_NUMERICAL where a call of ``ran`` returned memory that a later call wrote
        over (``held_outputs.returned_again``). Looked at once the window is charged: the
        search is the guard's work, which the trusted window does not do."""
        if again := held_outputs.returned_again(ran.described, self.expected):
            earlier, later, j = again
            w = self.cx.w
            name = list(self.cx.d.outputs)[j]
            raise Rejection(
                "benchmark",
                "INCORRECT_NUMERICAL",
                reuse.overwritten(
                    f"{name!r} of call {later} of the outside clock's loop on {w.uuid}", f"call {earlier}"
                ),
                None,
                w.uuid,
            )

    def charge(self, ran: Ran) -> tuple[float, float]:
        """The candidate's window, its tree stopped by the caller: (what it is charged, the part
        of that its tree ran on other cores beside its busiest thread).

        Where its sandbox's CPU time is counted by the kernel (``sandbox.cgroups``: every task
        that was ever in it, a process started and reaped inside the window included, which a
        reading of its tree would miss), the window is charged the CPU time it took: the
        sandbox's and this thread's own (writing, reading, the handshakes), as the trusted
        window is (``trusted_charge``). Stalls then drop out of both windows, so an honest
        figure on a busy machine is not floored by its own window's stalls, and waiting computes
        nothing. Nor can work hidden behind the guard's own make the window shorter: a loop
        that said each call done before computing it, then computed while the guard read and
        wrote, had a wall shorter than the CPU time of the two sides, and while the wall was
        charged where it was the less, a loaded machine that let it win its race with the
        guard's read let it gain (fresh-clone suite, session 50).

        Where the count is not kept the window is charged its wall plus what ran beside its
        busiest thread (``charged``), and never less than the CPU time its tree's readings and
        this thread found."""
        counted1 = self.cx.worker.cpu_ns()
        counted = counted1 - ran.counted0 if ran.counted0 is not None and counted1 is not None else None
        mine = time.thread_time() - ran.mine0
        after = tree_cpu.read(self.run_pid)
        wall, parallel = charged(time.monotonic() - ran.t0, ran.tree0, after, self.cx.w, counted)
        self.by_cpu_time = counted is not None
        if counted is not None:
            took = counted / 1e9 + mine
        else:
            took = max(wall, tree_cpu.used_ns(ran.tree0, after) / 1e9 + mine)
        log.debug("candidate's window on %s: %.5f s wall and beside, %.5f s run", self.cx.w.uuid, wall, took)
        return took, parallel

    def trusted_charge(self, wall_s: float, cpu_s: float) -> float:
        """The trusted window's charge, after the candidate's window it follows was charged:
        the CPU time it took (its worker's and this thread's) where that window was charged its
        CPU time; elsewhere the lesser of that and its wall plus what ran beside (the
        candidate's window is charged at least its wall then). Taken from the charge itself,
        not a second reading of the sandbox's count, which could fail where the first did not."""
        return cpu_s if self.by_cpu_time else min(wall_s, cpu_s)

    def trusted(self, overhead: m.Overhead, chosen: list[int]) -> tuple[float, float, m.OverheadReply]:
        """The trusted worker's window on the last window's inputs, run as the candidate's was:
        the same inputs written into its own buffers (call by call where paced), as many bytes
        read out of it for the chosen calls, ended and charged as the candidate's window was.
        (charged wall, CPU time, the reply).

        CPU time is what a stall cannot lengthen, and the outside figure is taken from the
        candidate's window: a trusted window that the machine's other work held off its core
        made the figure short, by as much as the whole call (a median forged 1000x short then
        decided at 13x and 58x below the honest figure: red team, session 32). It counts every
        thread of the trusted worker and this thread's own (writing, reading, checking)."""
        cx, w = self.cx, self.cx.w
        staging = self.staging
        if staging is None:
            raise GuardError(f"the trusted loop on {w.uuid} ran before any window of the candidate's")
        mirror = cx.trusted.workdir / "read" / "mirror"
        mirror.mkdir(parents=True, exist_ok=True)
        wanted = set(chosen)
        try:
            pid = staged_inputs.worker_process(cx.trusted, staging.trusted_pid)
            with Memory(pid) as memory:

                def on_done(i: int, outputs: list[tuple[int, list[int]]]) -> None:
                    if i in wanted:  # what the candidate's window reads, read here too
                        held_outputs.read_call(pid, outputs, self.expected, mirror, f"call{i}", w)

                memory.write(staging.data, staged_inputs.before_window(staging.trusted, self.paced))
                tree0 = tree_cpu.read(self.loop_pid)
                with no_gc():
                    mine0 = time.thread_time()
                    t0 = time.monotonic()
                    _, loop = paced_calls.request(
                        cx.trusted,
                        overhead,
                        m.OverheadReply,
                        memory,
                        staging.data,
                        staging.trusted,
                        self.ndims,
                        on_done,
                        cx.timeout,
                    )
                    # ended and charged as the candidate's window was; the guard's own, not watched
                    with frozen(self.loop_pid, watch=False):
                        after = tree_cpu.read(self.loop_pid)
                        wall = tree_cpu.charged_s(time.monotonic() - t0, tree0, after)
                        took = tree_cpu.used_ns(tree0, after) / 1e9 + time.thread_time() - mine0
        except (PeekError, Rejection) as exc:
            raise GuardError(f"the trusted worker's loop on {w.uuid} could not be paced: {exc}") from None
        return wall, took, loop


def _write_stopped(
    cx: WorkloadContext,
    memory: Memory,
    staging: staged_inputs.Staging,
    paced: bool,
    then: Callable[[], T],
) -> T:
    """The inputs the candidate's window starts with written while its processes are stopped,
    and ``then`` read before they run again (the readings its window is charged from)."""
    with candidate_stopped(cx.worker, cx.w, "while the guard wrote the inputs of its loop"):
        writes = staged_inputs.before_window(staging.candidate, paced)
        candidates_memory_fault(cx.w, lambda: memory.write(staging.data, writes))
        return then()


@contextmanager
def _candidate_memory(cx: WorkloadContext, staging: staged_inputs.Staging) -> Iterator[tuple[int, Memory]]:
    """The candidate's worker's memory, opened in the process its set-up named before any of
    its code ran: (its host pid, the open memory)."""
    pid = candidates_memory_fault(cx.w, lambda: staged_inputs.worker_process(cx.worker))
    with Memory(pid) as memory:
        yield pid, memory


def candidates_memory_fault(w: Workload, do: Callable[[], T]) -> T:
    """``do``, which reads or writes the candidate's worker where its process said: a place
    that cannot be read or written so is REWARD_HACK."""
    try:
        return do()
    except PeekError as exc:
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"the candidate's worker described memory of the outside clock's loop on {w.uuid} that "
            f"cannot be read or written as it said: {exc}",
            None,
            w.uuid,
        ) from None


def charged(
    wall_s: float, before: tree_cpu.TreeCpu, after: tree_cpu.TreeCpu, w: Workload, counted_ns: int | None = None
) -> tuple[float, float]:
    """A CPU window of the candidate's that ended at the reading ``after`` (its tree stopped):
    (its wall plus what its tree ran on other cores beside its busiest thread, that part, by
    the readings or by ``counted_ns``, its sandbox's cgroup count, where that is more). A
    window in which a process of the tree ended is REWARD_HACK: what that process ran cannot be
    counted."""
    if gone := tree_cpu.vanished(before, after):
        raise Rejection(
            "benchmark",
            "REWARD_HACK",
            f"processes {gone} of the candidate's tree ended while the guard's clock timed its loop on "
            f"{w.uuid}: the CPU time they used cannot be charged",
            None,
            w.uuid,
        )
    parallel = tree_cpu.parallel_ns(before, after, counted_ns) / 1e9
    return wall_s + parallel, parallel
