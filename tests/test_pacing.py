"""A CPU window's calls paced one at a time (``guard/runner/pacing.py``): the handshake's bytes,
the guard's sends that cannot block for good, and what a DONE says of a call's outputs."""

from __future__ import annotations

import socket
import time

import pytest

from guard.runner import pacing, protocol, tree_cpu

torch = pytest.importorskip("torch")


def test_what_the_peer_has_not_read_is_seen_and_goes_when_it_reads():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert protocol.unread(ours) == 0
        protocol.send_raw(ours, pacing.GO, time.monotonic() + 1)
        assert (protocol.unread(ours) or 0) > 0  # the GO waits to be read
        assert protocol.recv_raw(theirs, 1, time.monotonic() + 1) == pacing.GO
        assert protocol.unread(ours) == 0


def test_a_send_to_a_peer_that_reads_nothing_ends_at_its_deadline():
    """A candidate that never read the guard's GOs made a blocking send wait for good (red team,
    session 34); a send with a deadline gives up once the socket's buffer is full."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        t0 = time.monotonic()
        with pytest.raises(protocol.ReplyTimeout):
            for _ in range(1 << 20):
                protocol.send_raw(ours, bytes(4096), time.monotonic() + 0.2)
        assert time.monotonic() - t0 < 30


def test_a_reply_that_comes_where_a_done_was_awaited_is_read_whole():
    """A loop that fails sends its request's reply instead of the next DONE: the guard, having
    read its first byte, reads the rest of the message."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        protocol.send(theirs, {"ok": False, "status": "RUNTIME_ERROR", "message": "x" * 5000})
        first = protocol.recv_raw(ours, 1, time.monotonic() + 1)
        assert first != pacing.DONE
        reply = protocol.recv_rest(ours, first, time.monotonic() + 1)
        assert reply["status"] == "RUNTIME_ERROR" and len(reply["message"]) == 5000


def test_a_done_says_where_each_output_lies_and_nothing_for_what_is_no_tensor():
    from guard.runner.confirm import pack_outputs

    y = torch.zeros(4, 8)[:, ::2]  # a strided view: its strides travel too
    payload = pack_outputs([y, 3.0], [2, 1])
    assert len(payload) == pacing.payload_size([2, 1])
    assert pacing.unpack(payload, [2, 1]) == [(y.data_ptr(), [8, 2]), (0, [0])]
    # fewer outputs than the definition has, or one of another rank: zeros, nothing to read
    assert pacing.unpack(pack_outputs([torch.zeros(3)], [2, 1]), [2, 1]) == [(0, [0, 0]), (0, [0])]


def test_cpu_time_that_the_readings_miss_is_charged_beside_the_busiest_thread():
    """A child forked and reaped inside a window is in neither reading of the tree; the cgroup's
    count, where kept, has it, and is charged beside the busiest thread where it is more."""
    before = tree_cpu.TreeCpu({(1, 7): 0}, {(1, 1): 0}, began_ns=0, ended_ns=0)
    after = tree_cpu.TreeCpu({(1, 7): 10_000_000}, {(1, 1): 10_000_000}, began_ns=0, ended_ns=20_000_000)
    assert tree_cpu.parallel_ns(before, after) == 0  # one thread did all the readings saw
    assert tree_cpu.parallel_ns(before, after, counted_ns=18_000_000) == 8_000_000
    assert tree_cpu.parallel_ns(before, after, counted_ns=5_000_000) == 0  # never less than the readings
