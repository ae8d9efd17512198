"""The mark that the repeat check writes into a first call's outputs (the correctness gate
calls a candidate twice on the same inputs, on a GPU).

After the first call the guard overwrites its outputs with the mark, in place, lets go of
them, and calls again. A second call that computes writes its answer; one that hands back a
result it kept returns the mark: the very buffer (a cache that returns what it returned
before), or a copy of it (a cache that clones its entry: on the H100, session 37, such a C++
cache read as non-determinism, INCORRECT_NUMERICAL).

Only a first output whose memory is still referenced once the guard has let go of it can be
kept (``still_held``): memory that was freed goes back to the allocator, and an unwritten
output of the second call may be given it, mark and all (a block freed by the first call and
handed to the second at the same address, a destination buffer the guard allocated there). The
mark is not the poison of free blocks (``poison.POISON_BYTE``, which the blocks get again
before the second call), so a fresh unwritten output never reads as it. Bool outputs are
marked True, which is also how the guard poisons a destination buffer: for them only the very
buffer counts, never a copy.

An output laid out otherwise than contiguously, or a conjugate or negative view, cannot be read
back as bytes: it is poisoned instead where it can be, and the comparison of the two calls
judges it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .harness import T
from .poison import POISON_BYTE, poison_tensor, uniform_byte

# Not the free blocks' poison. As a value: -2 in int8, 254 in uint8, -448 in float8 e4m3fn, a
# large negative number in bfloat16 and float32, a NaN in float16: an honest output that is this
# everywhere is not watched (``first_outputs``).
MARK_BYTE = 0xFE


@dataclass(frozen=True)
class FirstOutput:
    """One output of the first call: where its bytes lie, whether the mark can tell its second
    call, and a weak reference to its memory (freed by ``still_held``)."""

    address: int
    nbytes: int
    watched: bool
    is_bool: bool
    weak_ref: int


def _mark_byte(t: Any) -> int:
    return 1 if t.dtype == torch.bool else MARK_BYTE


def _writable(t: Any, device_type: str) -> bool:
    return bool(T.isinstance(t, T.tensor_type) and t.device.type == device_type and T.numel(t) > 0)


def reads_as_mark(t: Any) -> bool:
    return bool(T.isinstance(t, T.tensor_type)) and uniform_byte(t) == _mark_byte(t)


def first_outputs(outs: list[Any], device_type: str = "cuda") -> list[FirstOutput | None]:
    """Per output of the first call, while the guard still holds it: None where it is no tensor
    on ``device_type``. Watched where its bytes can be read back and its answer is neither the
    mark (an honest all-True mask) nor the poison (an output the call left unwritten)."""
    first: list[FirstOutput | None] = []
    for t in outs:
        if not _writable(t, device_type):
            first.append(None)
            continue
        byte = uniform_byte(t)
        readable = t.is_contiguous() and not t.is_conj() and not t.is_neg()
        # the poison: 0xFF bytes (a free block left unwritten), or True for a bool the guard poisoned
        watched = readable and (byte is None or byte not in (_mark_byte(t), POISON_BYTE))
        first.append(
            FirstOutput(
                address=T.data_ptr(t),
                nbytes=T.numel(t) * t.element_size(),
                watched=watched,
                is_bool=t.dtype == torch.bool,
                weak_ref=T.storage_weak_ref(T.untyped_storage(t)),
            )
        )
    return first


def mark_in_place(outs: list[Any], device_type: str = "cuda") -> None:
    """The mark written over each output on ``device_type``; poison where its bytes cannot be
    written as such (laid out otherwise), nothing on a conjugate or negative view."""
    for t in outs:
        if not _writable(t, device_type) or t.is_conj() or t.is_neg():
            continue
        if t.is_contiguous():
            T.fill_(T.view(T.view(t, (-1,)), torch.uint8), _mark_byte(t))
        else:
            poison_tensor(t)


def still_held(first: list[FirstOutput | None]) -> list[bool]:
    """Per first output, once the guard has let go of every reference of its own: whether
    anything still references its memory (a candidate's cache does; an honest call's output
    was freed). Each weak reference is released here."""
    held = []
    for f in first:
        if f is None:
            held.append(False)
            continue
        held.append(not T.storage_expired(f.weak_ref))
        T.storage_free_weak_ref(f.weak_ref)
    return held


def kept_from_first_call(
    names: list[str], second: list[Any], first: list[FirstOutput | None], held: list[bool]
) -> str | None:
    """Why a second call on the same inputs returned a result kept from the first, or None: a
    watched first output whose memory was still held, and a second output holding nothing but
    the mark, that memory itself or (not a bool) a copy of it."""
    for name, t, was, kept in zip(names, second, first, held):
        if was is None or not was.watched or not kept or not reads_as_mark(t):
            continue
        if T.data_ptr(t) == was.address:
            return (
                f"output {name!r} of a second call on the same inputs is the first call's output, still "
                "holding the mark the guard wrote into it after that call: the candidate returned a "
                "result it had kept, without computing it"
            )
        if not was.is_bool:
            return (
                f"output {name!r} of a second call on the same inputs is a copy of the first call's "
                "output as the guard overwrote it after that call (its mark, which no call computes), "
                "which the candidate still held: it returned a result it had kept, without computing it"
            )
    return None
