"""Requests to the workers as the cascade makes them: a typed request out, a typed reply back.
A reply that does not parse is the worker's fault: the trusted worker's is the guard's own
error, the candidate's worker's a REWARD_HACK (its process answered out of protocol)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..runner import messages as m
from ..runner.process import WorkerDied, WorkerProcess, WorkerTimeout
from .reasons import GuardError, Rejection

T = TypeVar("T")
log = logging.getLogger(__name__)


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
    return Asked(worker, request, reply_model, gate).reply(timeout)


class Asked(Generic[m.R]):
    """A request sent and not yet answered: the worker works on it while the guard does
    something else (``reply`` waits for the answer, with ``ask``'s rules for failures)."""

    def __init__(
        self,
        worker: WorkerProcess,
        request: m.CandidateRequest | m.TrustedRequest,
        reply_model: type[m.R],
        gate: str,
    ) -> None:
        self.worker, self.op, self.reply_model, self.gate = worker, request.op, reply_model, gate
        self.answered = False  # the reply was taken (or the wait for it failed)
        self._call(lambda: worker.send(request.model_dump(mode="json")))

    def reply(self, timeout: float) -> m.R:
        self.answered = True
        return self.taken(self._call(lambda: self.worker.receive(timeout)))

    def during(self, do: Callable[[], T]) -> T:
        """``do`` while the request is outstanding (a paced loop's handshakes,
        ``paced_calls``), with ``ask``'s rules for a worker that dies or does not answer."""
        return self._call(do)

    def taken(self, raw: dict[str, Any]) -> m.R:
        """The reply as ``reply_model``, read already (by ``reply``, or by a paced loop that
        ended before its last call)."""
        self.answered = True
        try:
            return m.parse_reply(raw, self.reply_model)
        except m.MessageError as exc:
            if self.worker.role == "trusted":
                raise GuardError(f"the trusted worker answered {self.op!r} out of protocol: {exc}") from None
            raise Rejection(
                self.gate, "REWARD_HACK", f"the candidate's worker answered {self.op!r} out of protocol: {exc}", None
            ) from None

    def drop(self, timeout: float) -> None:
        """Wait for the reply, if not yet taken, and drop it: a failure elsewhere decided the
        verdict meanwhile, and the worker's next request must get its own answer."""
        if self.answered:
            return
        try:
            self.reply(timeout)
        except Exception as exc:  # noqa: BLE001 - the failure already raised is the verdict
            log.info("dropped the reply to %s: %s", self.op, exc)

    def _call(self, do: Callable[[], T]) -> T:
        try:
            return do()
        except (WorkerDied, WorkerTimeout) as exc:
            if self.worker.role == "trusted":
                raise GuardError(f"the trusted worker failed during {self.op}: {exc}") from None
            raise
