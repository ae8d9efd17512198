"""What every timing request about one workload shares: the context it carries, asking a
worker, the candidate's processes stopped while the guard measures, an idle device before and
after the trusted worker's loop, and no collection in the guard's process while its clock runs."""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..problems.schema import Definition, Workload
from ..runner import messages as m
from ..runner.freeze import FreezeError, frozen
from ..runner.process import WorkerProcess
from .asking import ask
from .reasons import GuardError, Rejection, Unpaired, candidate_status, first_line
from .reference_side import ReferenceSide

log = logging.getLogger(__name__)


@dataclass
class WorkloadContext:
    """What every request about the workload being timed carries."""

    ref: ReferenceSide
    worker: WorkerProcess
    trusted: WorkerProcess
    key: str
    d: Definition
    w: Workload
    workload: dict[str, Any]
    axes: dict[str, int]
    sets: list[int]
    timeout: float

    def trusted_fields(self) -> dict[str, Any]:
        """What every trusted-worker request about this workload names: the reference's key, the
        workload, its axes and the live input sets."""
        return {"key": self.key, "workload": self.workload, "axes": self.axes, "sets": self.sets}


def call(
    worker: WorkerProcess, request: m.CandidateRequest | m.TrustedRequest, reply_model: type[m.R], timeout: float
) -> m.R:
    return ask(worker, request, reply_model, timeout, "benchmark")


def failure(reply: m.Reply, w: Workload, doing: str) -> Exception:
    if reply.status == "INTERNAL":
        log.warning("the candidate's worker failed in its own step while %s %s: %s", doing, w.uuid, reply.message)
    status = candidate_status(reply.status)
    return Rejection(
        "benchmark",
        status,
        f"{status} while {doing} {w.uuid}: {first_line(reply.message or '')}",
        reply.message,
        w.uuid,
    )


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """No collection in the guard's process while its clock runs around a window."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def wait_device_idle(ref: ReferenceSide, trusted: WorkerProcess, w: Workload, when: str) -> None:
    """With the candidate's processes stopped, nothing else should run on the device while the
    trusted worker times its loop; work the candidate queued before it was stopped still does,
    and would lengthen that loop and so shorten the outside figure. Wait for the device to be
    idle (flush passes as fast as the trusted worker's calibration), up to ``drain_wait_s``."""
    if ref.device.kind != "cuda":
        return
    deadline = time.monotonic() + ref.cfg.drain_wait_s
    while True:
        probe = call(trusted, m.DeviceIdle(), m.DeviceIdleReply, ref.cfg.call_timeout_s)
        if not probe.ok:
            raise GuardError(f"the trusted worker could not probe the device: {probe.message}")
        if probe.pass_ms <= ref.cfg.drain_factor * probe.flush_ms:
            return
        if time.monotonic() > deadline:
            raise Rejection(
                "benchmark",
                "REWARD_HACK",
                f"the device stayed busy {when} on {w.uuid} while the candidate's processes were "
                f"stopped: work it left queued slows what the guard measures next",
                f"a flush pass took {probe.pass_ms * 1e3:.1f} us against {probe.flush_ms * 1e3:.1f} us "
                f"idle, for {ref.cfg.drain_wait_s:.0f} s",
                w.uuid,
            )
        time.sleep(0.05)


class StoppedButRan(Rejection):
    """A candidate's process tree ran while the guard had it stopped (or could not be stopped):
    whatever was measured meanwhile may have been slowed on purpose."""


@contextlib.contextmanager
def candidate_stopped(worker: WorkerProcess, w: Workload | None, during: str, accuse: bool = True) -> Iterator[None]:
    """The candidate's whole process tree stopped for the block (``runner.freeze``); a tree
    that keeps growing when stopped, or that used CPU time or made processes meanwhile, is
    REWARD_HACK (StoppedButRan): a process that escaped the stop can slow what the guard
    measures while the candidate is supposed to be still, and so shorten its outside figure.
    ``accuse`` False (an incumbent stopped while a challenger is timed): Unpaired instead."""
    pid = worker.proc.pid if worker.proc is not None else None
    failed: BaseException | None = None  # what the block raised: second to an escape, which may have caused it
    try:
        with frozen(pid, group=worker.cgroup_dir) as fz:
            try:
                yield
            except BaseException as exc:  # noqa: BLE001 - raised again below
                failed = exc
    except FreezeError as exc:
        # Whether it keeps growing or will not stop (a process held in uninterruptible sleep
        # by its own child: a red team's incumbent blocked every challenger so), the stopped
        # candidate's doing: an idle worker's processes stop at once.
        why: str | None = str(exc)
    else:
        why = fz.escaped()
    if why is not None:
        uuid = w.uuid if w is not None else None
        where = f" on {uuid}" if uuid else ""
        reason = f"{why} {during}{where}: work done while stopped slows what the guard measures then"
        if not accuse:
            raise Unpaired(reason, "REWARD_HACK") from failed
        raise StoppedButRan("benchmark", "REWARD_HACK", reason, None, uuid) from failed
    if failed is not None:
        raise failed
