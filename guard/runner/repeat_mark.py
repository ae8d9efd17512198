"""The mark that the repeat check writes into a first call's outputs (the correctness gate
calls a candidate twice on the same inputs, on a GPU).

After the first call the guard overwrites its outputs with the mark, in place, lets go of
them, and calls again. A second call that computes writes its answer; one that hands back a
result it kept returns the mark: the very buffer (a cache that returns what it returned
before), or a copy of it (a cache that clones its entry: on the H100, session 37, such a C++
cache read as non-determinism, INCORRECT_NUMERICAL).

Only a first output whose memory something still references after the second call can be a
kept one (a weak reference to its storage says so): memory freed by the first call, or during
the second, goes back to the allocator, and an unwritten output of the second call may be given
it, mark and all. The mark is 0x01 in every byte: not the poison that free blocks get before
the second call (``poison.POISON_BYTE``, 0xFF), so a fresh unwritten output never reads as it;
True for a bool; and a tiny number in every float type, so a kernel that accumulates into a
buffer it keeps, without zeroing it, returns its sums and not the mark (with a mark of large
magnitude the sums would have stayed the mark: a review of ours, session 37). A destination
buffer the guard allocates is poisoned True if it is a bool, which reads as the mark: for bool
outputs only the kept storage itself counts, never a copy.

Only first answers whose bytes are not all one value are watched (an honest all-True mask, an
all-zero answer: nothing tells them from a kept buffer that the kernel left alone), and only
contiguous ones that are not conjugate or negative views (their bytes can be read back as they
are). The comparison of the two calls judges every other output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .harness import T
from .poison import poison_tensor, uniform_byte

# As a value: True; 1 in int8 and uint8; 2.4e-38 in float32 and bfloat16, 1.5e-5 in float16
# (subnormal), 0.002 in float8 e4m3fn; 7.1e-304 in float64; 72340172838076673 in int64.
MARK_BYTE = 0x01


@dataclass(frozen=True)
class FirstOutput:
    """One output of the first call: whether the mark can tell its second call, whether it is a
    bool, and a weak reference to its storage (released by ``release``)."""

    watched: bool
    is_bool: bool
    weak_ref: int


def _writable(t: Any, device_type: str) -> bool:
    return bool(T.isinstance(t, T.tensor_type) and t.device.type == device_type and T.numel(t) > 0)


def _readable(t: Any) -> bool:
    return bool(t.is_contiguous() and not t.is_conj() and not t.is_neg())


def reads_as_mark(t: Any) -> bool:
    return bool(T.isinstance(t, T.tensor_type)) and uniform_byte(t) == MARK_BYTE


def first_outputs(outs: list[Any], device_type: str = "cuda") -> list[FirstOutput | None]:
    """Per output of the first call, while the guard still holds it (None: no tensor on
    ``device_type``). A weak reference to each one's storage is taken: ``release`` them."""
    first: list[FirstOutput | None] = []
    try:
        for t in outs:
            if not _writable(t, device_type):
                first.append(None)
                continue
            watched = _readable(t) and uniform_byte(t) is None
            ref = T.storage_weak_ref(T.untyped_storage(t))
            first.append(FirstOutput(watched=watched, is_bool=t.dtype == T.bool_dtype, weak_ref=ref))
    except BaseException:
        release(first)
        raise
    return first


def mark_in_place(outs: list[Any], device_type: str = "cuda") -> None:
    """The mark written over each output on ``device_type``; poison where its bytes cannot be
    written as such (laid out otherwise), nothing on a conjugate or negative view."""
    for t in outs:
        if not _writable(t, device_type) or t.is_conj() or t.is_neg():
            continue
        if t.is_contiguous():
            T.fill_(T.view(T.view(t, (-1,)), T.uint8_dtype), MARK_BYTE)
        else:
            poison_tensor(t)


def kept_from_first_call(names: list[str], second: list[Any], first: list[FirstOutput | None]) -> str | None:
    """After the second call: why it returned a result kept from the first, or None. A watched
    first output whose storage something still references, and a second output holding nothing
    but the mark: that storage itself, or (not a bool) a copy of it."""
    for name, t, was in zip(names, second, first):
        if was is None or not was.watched or T.storage_expired(was.weak_ref) or not reads_as_mark(t):
            continue
        if T.untyped_storage(t)._cdata == was.weak_ref:
            return (
                f"output {name!r} of a second call on the same inputs is the first call's output, still "
                "holding the mark the guard wrote into it after that call: the candidate returned a "
                "result it had kept, without computing it"
            )
        if not was.is_bool:
            return (
                f"output {name!r} of a second call on the same inputs is a copy of the first call's "
                "output as the guard overwrote it after that call (its mark, which no call computes), "
                "which the candidate still holds: it returned a result it had kept, without computing it"
            )
    return None


def release(first: list[FirstOutput | None]) -> None:
    """The weak references of ``first_outputs`` given back (once: ``first`` is emptied)."""
    for f in first:
        if f is not None:
            T.storage_free_weak_ref(f.weak_ref)
    first.clear()
