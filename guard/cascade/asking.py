"""Requests to the workers as the cascade makes them: a typed request out, a typed reply back.
A reply that does not parse is the worker's fault: the trusted worker's is the guard's own
error, the candidate's worker's a REWARD_HACK (its process answered out of protocol)."""

from __future__ import annotations

from ..runner import messages as m
from ..runner.process import WorkerDied, WorkerProcess, WorkerTimeout
from .reasons import GuardError, Rejection


def ask(
    worker: WorkerProcess,
    request: m.CandidateRequest | m.TrustedRequest,
    reply_model: type[m.R],
    timeout: float,
    gate: str,
) -> m.R:
    """``request`` to ``worker``; its reply as ``reply_model``. A trusted worker that dies or
    does not answer is the guard's error; a candidate's worker that does is left to the
    caller (``WorkerDied``, ``WorkerTimeout``: the cascade says which gate it was in)."""
    try:
        raw = worker.request(request.model_dump(mode="json"), timeout)
    except (WorkerDied, WorkerTimeout) as exc:
        if worker.role == "trusted":
            raise GuardError(f"the trusted worker failed during {request.op}: {exc}") from None
        raise
    try:
        return m.parse_reply(raw, reply_model)
    except m.MessageError as exc:
        if worker.role == "trusted":
            raise GuardError(f"the trusted worker answered {request.op!r} out of protocol: {exc}") from None
        raise Rejection(
            gate, "REWARD_HACK", f"the candidate's worker answered {request.op!r} out of protocol: {exc}", None
        ) from None
