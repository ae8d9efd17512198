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


def test_a_dropped_request_is_answered_once_and_its_failure_swallowed():
    from guard.cascade.asking import Asked

    class Counting(FakeWorker):
        received = 0

        def receive(self, timeout):
            self.received += 1
            return super().receive(timeout)

    worker = Counting("candidate", {"ok": True, "peak_bytes": 1, "by_op": {}})
    asked = Asked(worker, m.Memory(), m.MemoryReply, "correctness")
    asked.drop(5)  # a failure elsewhere: the reply is still read, so the worker stays in step
    asked.drop(5)
    assert worker.received == 1
    answered = Asked(worker, m.Memory(), m.MemoryReply, "correctness")
    answered.reply(5)
    answered.drop(5)  # already read: nothing more to wait for
    assert worker.received == 2
    Asked(Counting("candidate", WorkerDied("killed", -9, "")), m.Memory(), m.MemoryReply, "benchmark").drop(5)


@pytest.mark.parametrize(
    "payload",
    [b"[" * 100_000 + b"]" * 100_000, b'{"n": ' + b"7" * 5001 + b"}", b'{"a": 1', b"\xff\xfe", b"[1, 2]"],
    ids=["nested-100000-deep", "5001-digit-integer", "cut-short", "not-utf8", "not-an-object"],
)
def test_whatever_a_peers_bytes_make_the_decoder_raise_is_a_malformed_message(payload):
    """A candidate's worker raised its own recursion limit and sent a reply nested 3000 deep:
    the decoder's RecursionError (and a long integer's ValueError) escaped as neither a
    malformed message nor a verdict (red team, session 17). (3000 deep decodes on Python 3.12,
    whose decoder's limit is its C stack's: it is then refused as a reply with an extra field.)"""
    import socket

    from guard.runner import protocol

    a, b = socket.socketpair()
    try:
        a.sendall(protocol._HEADER.pack(len(payload)) + payload)
        with pytest.raises(protocol.ProtocolError):
            protocol.recv(b, timeout=5)
    finally:
        a.close()
        b.close()


def test_a_failed_reply_may_carry_only_a_failures_status():
    from guard.cascade.reasons import candidate_status

    assert candidate_status("INCORRECT_NUMERICAL") == "INCORRECT_NUMERICAL"
    assert candidate_status("INTERNAL") == candidate_status(None) == "RUNTIME_ERROR"
    # a wrong kernel's worker once answered "failed, status PASSED" and was recorded PASSED;
    # a status that does not exist withheld the verdict
    assert candidate_status("PASSED") == candidate_status("PASSED_WITH_HONOURS") == "REWARD_HACK"


def test_bytes_that_are_no_message_are_out_of_protocol_as_a_reply_that_does_not_validate():
    """Whether a deep reply fails to decode or decodes and fails to validate depends on the
    Python version; the candidate's verdict must not."""
    from guard.cascade.reasons import died
    from guard.runner.process import MalformedReply

    garbled = died("correctness", MalformedReply("candidate worker sent a malformed reply", None, ""))
    assert garbled.status == "REWARD_HACK" and "out of protocol" in garbled.reason
    assert died("correctness", WorkerDied("killed", -9, "")).status == "RUNTIME_ERROR"


def test_a_lone_surrogate_from_a_worker_cannot_withhold_the_verdict():
    """A candidate that raised RuntimeError("bad \\ud800 value") had its worker send the escape,
    which decodes to a string UTF-8 cannot encode: storing the verdict failed and the
    evaluation ended without one (red team, session 18). Every string of a reply is made
    encodable; a proper pair (an emoji) stays as it is."""
    import json
    import socket

    from guard.runner import protocol

    a, b = socket.socketpair()
    try:
        protocol.send(a, {"ok": False, "message": "bad \ud800 value", "k\udfff": ["smile \U0001f600"]})
        got = protocol.recv(b, timeout=5)
    finally:
        a.close()
        b.close()
    assert got == {"ok": False, "message": "bad ? value", "k?": ["smile \U0001f600"]}
    json.dumps(got, ensure_ascii=False).encode("utf-8")  # storable


def test_a_memory_report_names_only_request_kinds_that_exist():
    """The names become keys of the verdict's peak_memory_by_gate: a candidate's worker named
    one "SHAPE=29x4096" and showed the held-out shapes it had seen (red team, session 18)."""
    ok = m.parse_reply({"ok": True, "peak_bytes": 5, "by_op": {"check": 5, "arm": 3}}, m.MemoryReply)
    assert ok.by_op == {"check": 5, "arm": 3}
    with pytest.raises(m.MessageError, match="request kinds that do not exist"):
        m.parse_reply({"ok": True, "peak_bytes": 5, "by_op": {"SHAPE=29x4096": 5}}, m.MemoryReply)


def test_a_reply_on_a_descriptor_numbered_past_1024_is_received():
    """``select.select`` cannot wait on descriptors past 1024, and a long-lived server holds
    many (each worker's socket, log and pidfd): the wait polls instead."""
    import os
    import resource
    import socket

    from guard.runner import protocol

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1500:
        pytest.skip(f"descriptors are capped at {hard} here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    a, b = socket.socketpair()
    high = os.dup2(b.fileno(), 1500)
    far = socket.socket(fileno=high)
    try:
        protocol.send(a, {"ok": True})
        assert protocol.recv(far, timeout=5) == {"ok": True}
        with pytest.raises(protocol.ReplyTimeout):
            protocol.recv(far, timeout=0.05)
    finally:
        far.close()
        a.close()
        b.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
