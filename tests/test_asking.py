"""Requests to the workers (``guard.cascade.asking.ask``): whose fault a failure is."""

from __future__ import annotations

import pytest

from guard.cascade import GuardError
from guard.cascade.asking import ask
from guard.cascade.reasons import Rejection
from guard.runner import messages as m
from guard.runner.process import WorkerDied


class FakeWorker:
    def __init__(self, role: str, answer):
        self.role, self.answer, self.sent = role, answer, []

    def send(self, message):
        self.sent.append(message)

    def receive(self, timeout):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_a_typed_request_goes_out_and_a_typed_reply_comes_back():
    worker = FakeWorker("trusted", {"ok": True, "peak_bytes": 7, "by_op": {"compare": 7}})
    reply = ask(worker, m.Memory(reset=True), m.MemoryReply, 5, "correctness")
    assert isinstance(reply, m.MemoryReply) and reply.by_op == {"compare": 7}
    assert worker.sent == [{"op": "memory", "reset": True}]


def test_a_trusted_worker_s_failure_is_the_guard_s():
    died = FakeWorker("trusted", WorkerDied("killed", -9, ""))
    with pytest.raises(GuardError, match="trusted worker failed during memory"):
        ask(died, m.Memory(), m.MemoryReply, 5, "benchmark")
    garbled = FakeWorker("trusted", {"ok": True, "peak_bytes": "lots"})
    with pytest.raises(GuardError, match="out of protocol"):
        ask(garbled, m.Memory(), m.MemoryReply, 5, "benchmark")


def test_a_candidate_worker_s_failure_is_the_candidate_s():
    died = FakeWorker("candidate", WorkerDied("killed", -9, ""))
    with pytest.raises(WorkerDied):  # the cascade says in which gate its process died
        ask(died, m.Stats(), m.StatsReply, 5, "benchmark")
    forged = FakeWorker("candidate", {"ok": True, "stats": {}, "extra": "field"})
    with pytest.raises(Rejection) as caught:
        ask(forged, m.Stats(), m.StatsReply, 5, "correctness")
    assert caught.value.status == "REWARD_HACK" and caught.value.gate == "correctness"
