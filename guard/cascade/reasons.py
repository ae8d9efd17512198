"""Why an evaluation stops: a gate that turns the candidate down (``Rejection``), an
incumbent that cannot be timed again (``Unpaired``), or a fault that is not the
candidate's (``GuardError``); and the text helpers that word those reasons."""

from __future__ import annotations

from ..runner.process import WorkerDied, WorkerTimeout


class GuardError(RuntimeError):
    """Not the candidate's fault: a broken problem, a worker that cannot start, bad input."""


class Unpaired(Exception):
    """The incumbent could not be timed again; the stored measurement decides. ``status``:
    the incumbent's own rejection when it was caught (REWARD_HACK), which revokes it."""

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
    return Rejection(gate, "RUNTIME_ERROR", f"the candidate's process died: {exc}", trim_log(exc.log_tail))


def first_line(text: str) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:400]
    return ""


def trim_log(text: str) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return "\n".join(lines[-15:])[-3000:]
