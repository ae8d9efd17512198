"""One call at a time in a CPU's outside-clock windows: the worker's side.

Written before its window (``staged``), every call's inputs were in the candidate's memory at
once, and a loop that the candidate's code replaced computed a window's calls as one batch:
each call's own dispatch, most of a small call, was paid once a window (red team, session 34:
figures 3.7-4.7x below the honest kernel's on the smallest RMSNorm workload, ACCEPTed with a
forged median). So the guard writes call ``i + 1``'s inputs only once call ``i`` is done. After
each call the worker's loop sends DONE with where the call's outputs lie (``pack``) and waits
for GO; the guard reads the outputs of the calls it checks right then, before the next inputs
exist (a loop that says a call is done before computing it holds no answer there), writes the
next call's inputs and sends GO (``guard/cascade/paced_calls.py``). Nothing here imports torch:
the guard's side uses it too. The trusted loop is paced
alike, so the handshakes' cost is in both windows.

The bytes travel on the worker's request socket while the loop's request is outstanding; the
socket's functions are the ones ``protocol`` took before any candidate code was loaded.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from typing import Any

from . import protocol

GO, DONE = b"g", b"d"


def payload_size(ndims: list[int]) -> int:
    """Bytes of one call's DONE payload: per output, its address and its strides."""
    return 8 * sum(1 + nd for nd in ndims)


def unpack(payload: bytes, ndims: list[int]) -> list[tuple[int, list[int]]]:
    """A DONE payload read back (``confirm.pack_outputs`` made it): per output, (address,
    strides); address 0 where the output was not a CPU tensor of its rank."""
    out, at = [], 0
    for nd in ndims:
        values = struct.unpack_from(f"<{1 + nd}q", payload, at)
        at += 8 * (1 + nd)
        out.append((values[0], list(values[1:])))
    return out


class Pacer:
    """The worker's end of the handshake, on its request socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def go(self) -> None:
        """Wait until the guard has written the next call's inputs."""
        got = protocol.recv_raw(self.sock, len(GO))
        if got != GO:
            raise RuntimeError(f"the guard sent {got!r} where it paces a loop")

    def done(self, payload: bytes) -> None:
        """This call is done; its outputs lie as ``payload`` says."""
        protocol.send_raw(self.sock, DONE + payload)


@dataclass
class Pacing:
    """How a CPU loop is paced: the worker's ``pacer``, the definition's outputs' ranks, and
    (the trusted loop, which makes no call) buffers of the outputs' sizes that it describes
    in their place, so that the guard reads as many bytes out of it as out of the candidate's."""

    pacer: Pacer
    ndims: list[int]
    stand_ins: list[Any] = field(default_factory=list)
