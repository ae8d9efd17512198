"""The mark that the repeat check writes into a first call's outputs (the correctness gate
calls a candidate twice on the same inputs, on a GPU).

After the first call the guard overwrites its outputs with the mark, in place, and calls
again. A second call that computes writes its answer; one that hands back a result it kept
returns the mark: the very buffer (a cache that returns what it returned before), or a copy
of it (a cache that clones its entry: on the H100, session 37, such a C++ cache read as
non-determinism, INCORRECT_NUMERICAL). The mark is not the poison of free blocks
(``poison.POISON_BYTE``): memory the second call allocates and leaves unwritten reads as the
poison, not as the mark, unless it is the first call's own freed block, where an address
decides as before.

Bool outputs are marked True (0xFF is no valid bool; free blocks read 0xFF). An output laid
out otherwise than contiguously cannot be read back as bytes: it is poisoned instead
(``poison.poison_tensor``), and the comparison of the two calls judges it.
"""

from __future__ import annotations

from typing import Any

import torch

from .harness import T
from .poison import POISON_BYTE, poison_tensor, reads_as_bytes, reads_as_poison

MARK_BYTE = 0xFE  # not the free blocks' poison; as a float, a large negative number or a NaN

Range = tuple[int, int]  # (address, bytes)


def _mark_byte(t: Any) -> int:
    return 1 if t.dtype == torch.bool else MARK_BYTE


def reads_as_mark(t: Any) -> bool:
    return T.isinstance(t, T.tensor_type) and reads_as_bytes(t, _mark_byte(t))


def first_outputs(outs: list[Any], device_type: str = "cuda") -> list[tuple[Range, bool] | None]:
    """Per output of the first call: where it lies and whether the mark can tell its second
    call (None: no tensor on ``device_type``). Watched: contiguous, and an answer that reads
    neither as the mark (an honest all-True mask could not be told from a kept one) nor as the
    poison (an output the call left unwritten)."""
    first: list[tuple[Range, bool] | None] = []
    for t in outs:
        if not T.isinstance(t, T.tensor_type) or t.device.type != device_type or not T.numel(t):
            first.append(None)
            continue
        ok = (
            t.is_contiguous()
            and not reads_as_mark(t)
            and not reads_as_poison(t)
            and not reads_as_bytes(t, POISON_BYTE)  # a bool output on a free block, unwritten
        )
        first.append(((T.data_ptr(t), T.numel(t) * t.element_size()), ok))
    return first


def mark_in_place(outs: list[Any], device_type: str = "cuda") -> None:
    """The mark written over each output on ``device_type`` (poison where it is laid out
    otherwise than contiguously)."""
    for t in outs:
        if not T.isinstance(t, T.tensor_type) or t.device.type != device_type or not T.numel(t):
            continue
        if t.is_contiguous():
            T.fill_(T.view(T.view(t, (-1,)), torch.uint8), _mark_byte(t))
        else:
            poison_tensor(t)


def kept_from_first_call(names: list[str], second: list[Any], first: list[tuple[Range, bool] | None]) -> str | None:
    """Why a second call on the same inputs returned a result kept from the first, or None:
    a watched output holding nothing but the mark, at the first call's output's address (the
    kept buffer itself) or apart from every first output's memory (a copy of it: the blocks
    the second call is given unwritten were poisoned, and only the first outputs' own blocks,
    handed back, could hold the mark). Anything else is left to the comparison of the two calls."""
    spans = [f[0] for f in first if f is not None]
    for name, t, was in zip(names, second, first):
        if was is None or not was[1] or not reads_as_mark(t):
            continue
        at, size = T.data_ptr(t), T.numel(t) * t.element_size()
        if at == was[0][0]:
            return (
                f"output {name!r} of a second call on the same inputs is the first call's output, still "
                "holding the mark the guard wrote into it after that call: the candidate returned a "
                "result it had kept, without computing it"
            )
        if all(at + size <= lo or lo + n <= at for lo, n in spans):
            return (
                f"output {name!r} of a second call on the same inputs is a copy of the first call's "
                "output as the guard overwrote it after that call (its mark, which no call computes): "
                "the candidate returned a result it had kept, without computing it"
            )
    return None
