"""Length-prefixed JSON messages over a socket.

JSON, never pickle: a candidate worker is untrusted, and unpickling what it sends could run
code in the parent. Bulk tensor data travels as files (see tensorio), not messages.
"""

from __future__ import annotations

import fcntl
import json
import re
import select
import socket
import struct
import termios
import time
from typing import Any

MAX_MESSAGE = 64 * 1024 * 1024
_HEADER = struct.Struct("!Q")
# Taken at import, before a worker loads any candidate: a patched json or socket cannot
# forge what the worker sends.
_dumps, _loads = json.dumps, json.loads
_sendall, _send, _recv = socket.socket.sendall, socket.socket.send, socket.socket.recv
_poll = select.poll  # not select.select: a guard's descriptors may be numbered past 1024


class ProtocolError(RuntimeError):
    pass


class PeerGone(ProtocolError):
    """The other end closed the socket (the worker died)."""


class ReplyTimeout(ProtocolError):
    pass


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = _dumps(message, allow_nan=True).encode()
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    _sendall(sock, _HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReplyTimeout("no reply in time")
            poller = _poll()
            poller.register(sock, select.POLLIN)
            if not poller.poll(remaining * 1000):
                raise ReplyTimeout("no reply in time")
        chunk = _recv(sock, min(n - got, 1 << 20))
        if not chunk:
            raise PeerGone("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def send_raw(sock: socket.socket, data: bytes, deadline: float | None = None) -> None:
    """Bytes outside the framing, for a handshake inside an outstanding request (``pacing``),
    sent by ``deadline`` (monotonic) if given: a peer that reads nothing fills the socket's
    buffer, and a blocking send then waits for good (red team, session 34: the guard's thread
    sat in a send to a candidate that never read its GOs)."""
    if deadline is None:
        _sendall(sock, data)
        return
    view = memoryview(data)
    while view:
        remaining = deadline - time.monotonic()
        poller = _poll()
        poller.register(sock, select.POLLOUT)
        if remaining <= 0 or not poller.poll(remaining * 1000):
            raise ReplyTimeout("the peer read nothing in time")
        try:
            view = view[_send(sock, view, socket.MSG_DONTWAIT) :]
        except BlockingIOError:
            continue


def unread(sock: socket.socket) -> int | None:
    """What was sent on ``sock`` and not yet read by its peer, as the kernel accounts the
    buffers that hold it (a Unix socket's send queue keeps them until the peer reads; 0 when
    all was read), or None where the kernel does not say."""
    try:
        out = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
    except OSError:
        return None
    (count,) = struct.unpack("i", out)
    return int(count)


def recv_raw(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """Exactly ``n`` bytes outside the framing, by ``deadline`` (monotonic) if given."""
    return _recv_exact(sock, n, deadline)


def recv(sock: socket.socket, timeout: float | None = None) -> dict[str, Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    return recv_rest(sock, b"", deadline)


def recv_rest(sock: socket.socket, begun: bytes, deadline: float | None) -> dict[str, Any]:
    """A message of which the first bytes, ``begun``, were read already (a paced loop's reply
    that came where a handshake was awaited)."""
    header = begun + _recv_exact(sock, _HEADER.size - len(begun), deadline)
    (length,) = _HEADER.unpack(header[: _HEADER.size])
    if length > MAX_MESSAGE:
        raise ProtocolError(f"peer announced a {length}-byte message")
    data = header[_HEADER.size :] + _recv_exact(sock, length - len(header[_HEADER.size :]), deadline)
    try:
        message = _loads(data)
    except Exception as exc:  # noqa: BLE001 - not only JSONDecodeError: a reply nested 3000 deep
        # raised RecursionError and a 5001-digit integer ValueError, which withheld a verdict
        # (red team, session 17): whatever the peer's bytes make the decoder do is malformed
        raise ProtocolError(f"malformed message: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(message, dict):
        raise ProtocolError("message is not an object")
    if _SURROGATE.search(data):
        message = _encodable(message)
    out: dict[str, Any] = message
    return out


# A \ud800-\udfff escape: a lone one decodes to a string that UTF-8 cannot encode, and a
# candidate's exception text carrying one ended an evaluation without a verdict when the
# verdict was stored (red team, session 18). Pairs (emoji, escaped) are searched too; rare.
_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _encodable(value: Any) -> Any:
    """``value`` with every string (keys too) made encodable: a lone surrogate becomes '?'."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    return value
