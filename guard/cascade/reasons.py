"""Why an evaluation stops: a gate that turns the candidate down (``Rejection``), an
incumbent that cannot be timed again (``Unpaired``), or a fault that is not the
candidate's (``GuardError``); and the text helpers that word those reasons."""

from __future__ import annotations

from ..runner.process import MalformedReply, WorkerDied, WorkerTimeout


class GuardError(RuntimeError):
    """Not the candidate's fault: a broken problem, a worker that cannot start, bad input."""


class Unpaired(Exception):
    """The incumbent could not be timed again; the stored measurement decides. ``status``: the
    incumbent's own failure, as a challenger's would be judged (REWARD_HACK revokes it; any
    status lets the stored comparison decide against another agent's global best); None where
    the guard or the device failed, not the incumbent."""

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


class Rejection(Exception):
    """A gate turned the candidate down: the verdict is a REJECT with this status and reason."""

    def __init__(self, gate: str, status: str, reason: str, diagnostic: str | None = None, workload: str | None = None):
        super().__init__(reason)
        self.gate, self.status, self.reason = gate, status, reason
        self.diagnostic, self.workload = diagnostic, workload
        self.errors: dict[str, object] | None = None  # the failing visible workload's largest errors, if measured


def timed_out(gate: str, exc: WorkerTimeout, limit_s: float) -> Rejection:
    return Rejection(
        gate,
        "TIMEOUT",
        f"{exc} (limit {limit_s:.0f} s per call)",
        "the candidate was stopped; look for an infinite loop or a hang",
    )


def died(gate: str, exc: WorkerDied) -> Rejection:
    """The candidate's worker died, or sent bytes that are no message: out of protocol, as a
    reply that does not validate is (``asking``); no honest candidate writes to its socket.
    Which of the two a deep reply is depends on the decoder (Python 3.11's raised at 1000
    levels, 3.12's read 3000), so both get the same verdict."""
    if isinstance(exc, MalformedReply):
        return Rejection(gate, "REWARD_HACK", f"the candidate's worker answered out of protocol: {exc}", None)
    return Rejection(gate, "RUNTIME_ERROR", f"the candidate's process died: {exc}", trim_log(exc.log_tail))


def worker_failed(gate: str, exc: WorkerTimeout | WorkerDied, limit_s: float) -> Rejection:
    """A candidate's worker that hung (killed at the limit) or died, as the rejection its
    verdict records: a challenger's at ``gate``, or an incumbent's in a pairing, alike."""
    if isinstance(exc, WorkerTimeout):
        return timed_out(gate, exc, limit_s)
    return died(gate, exc)


def first_line(text: str) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:400]
    return ""


def trim_log(text: str) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return "\n".join(lines[-15:])[-3000:]


# what a failed reply of the candidate's worker may say of its candidate
FAILING_STATUSES = (
    "COMPILE_ERROR",
    "RUNTIME_ERROR",
    "TIMEOUT",
    "INCORRECT_SHAPE",
    "INCORRECT_DTYPE",
    "INCORRECT_NUMERICAL",
    "REWARD_HACK",
)


def candidate_status(status: str | None) -> str:
    """The status of a failed reply of the candidate's worker, once its build has begun. From
    then on the candidate's code runs in that process and can make any step fail, or answer
    anything. INTERNAL says the worker's own code failed, but is the candidate's RUNTIME_ERROR
    (a red team withheld its verdicts so, with a folder where an output file was to go), as is
    a reply without a status. A status that is not a failure's (PASSED on a failed reply, once
    recorded for a wrong kernel) or not a status at all (which withheld the verdict) is out of
    protocol: REWARD_HACK (red team, session 17). The worker's text stays in the diagnostic,
    and the caller logs it, for a fault of the guard's own."""
    if status in FAILING_STATUSES:
        return status
    if status in (None, "", "INTERNAL"):
        return "RUNTIME_ERROR"
    return "REWARD_HACK"
