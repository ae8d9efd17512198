"""What the guard and a zygote (``zygote``, ``zygote_main``) say to each other, as pydantic
models validated at both ends, as the workers' messages are (``messages``). One JSON message
each on a SOCK_SEQPACKET socket, with file descriptors beside it (``socket.send_fds``):

- ``Fork``, with the worker's socket and its log file: answered ``Forked`` (the pid in the
  zygote's PID namespace of the child it reaps) with a pidfd of that child, and for a
  candidate a pidfd of the worker (the cell's PID 1), beside it;
- ``Reap``, once that child has ended: answered ``Reaped``;
- ``Failed`` answers either where it could not be done (no process to be had) or was out of
  protocol; the zygote serves on.

The zygote's first message says whether it is ready (``Started``).
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import Field, TypeAdapter, ValidationError

from .messages import _Msg

__all__ = [
    "Failed",
    "Fork",
    "Forked",
    "REQUEST",
    "Reap",
    "Reaped",
    "Started",
    "ValidationError",
    "encode",
    "reply_of",
]


class Fork(_Msg):
    """Fork a worker: ``argv``, ``worker_main``'s arguments but ``--fd``; ``cwd``, its folder."""

    op: Literal["fork"] = "fork"
    argv: list[str]
    cwd: str
    env: dict[str, str]


class Reap(_Msg):
    op: Literal["reap"] = "reap"
    pid: int


REQUEST: TypeAdapter[Fork | Reap] = TypeAdapter(Annotated[Fork | Reap, Field(discriminator="op")])


class Started(_Msg):
    ready: bool
    error: str | None = None


class Forked(_Msg):
    pid: int
    cell: bool = False  # a cell's PID 1 is the worker, its pidfd the second one sent


class Reaped(_Msg):
    returncode: int | None  # None: no such child (reaped already)


class Failed(_Msg):
    error: str


R = TypeVar("R", Forked, Reaped, Started)


def encode(message: _Msg) -> bytes:
    return message.model_dump_json().encode()


def reply_of(data: bytes, expected: type[R]) -> R | Failed:
    """The reply in ``data``: the ``expected`` model, or ``Failed``. Raises ``ValidationError``
    for anything else (an answer out of turn)."""
    try:
        return expected.model_validate_json(data)
    except ValidationError:
        return Failed.model_validate_json(data)
