"""Poison in the memory a candidate may be handed without writing it.

Output memory a candidate allocates and never writes must read as NaN, never as data an
earlier call left there (its own outputs on the same inputs, above all). Every free block of
torch's caching allocator is filled with the poison byte in place, through its address: no
block is allocated for it, so poisoning adds nothing to the worker's peak memory (it used to
allocate twice the inputs' size as junk, 2 GiB beside a 1 GiB call). The candidate's worker
poisons before each checked call and before it hands cached blocks back to the driver, whose
next allocation in this process may return the same pages.
"""

from __future__ import annotations

from typing import Any

import torch

from .harness import T

POISON_BYTE = 0xFF  # 0xFFFF... is NaN in every float format


def free_ranges(segments: list[dict[str, Any]], device_index: int) -> list[tuple[int, int]]:
    """``(address, size)`` of every free block on one device, from the allocator's snapshot
    (``torch.cuda.memory_snapshot()``: segments whose blocks are listed in address order)."""
    ranges = []
    for seg in segments:
        if int(seg.get("device", device_index)) != device_index:
            continue
        address = int(seg["address"])
        for block in seg.get("blocks", []):
            size = int(block["size"])
            if block.get("state") == "inactive" and size > 0:
                ranges.append((int(block.get("address", address)), size))
            address += size
    return ranges


def _snapshot() -> list[dict[str, Any]]:
    """The allocator's segments without its history: a candidate that turned the history on
    must not make every poisoning convert all of it."""
    try:
        return list(T.memory_snapshot(include_traces=False))
    except TypeError:  # a torch without the argument
        return list(T.memory_snapshot())


def poison_tensor(t: Any) -> None:
    """Fill one tensor with the poison: the poison byte where its elements are one block (as
    in the free blocks), else NaN, True or all bits set by dtype. Any device: destination
    buffers are poisoned on the CPU too."""
    if not T.isinstance(t, T.tensor_type) or not T.numel(t):
        return
    if t.dtype == torch.bool:  # 0xFF is no valid bool
        T.fill_(t, True)
    elif t.is_contiguous():
        T.fill_(T.view(T.view(t, (-1,)), torch.uint8), POISON_BYTE)
    elif t.is_floating_point() or t.is_complex():
        T.fill_(t, float("nan"))
    else:
        T.fill_(t, 255 if t.dtype == torch.uint8 else -1)


def poison_in_place(tensors: list[Any]) -> None:
    """Overwrite outputs the guard has finished with before they are dropped, so that their
    memory reads as poison wherever it is handed out next, even where its free is deferred
    (a stream the candidate recorded it on) past the next ``poison_free_blocks``."""
    for t in tensors:
        if T.isinstance(t, T.tensor_type) and t.device.type == "cuda":
            poison_tensor(t)


def reads_as_poison(t: Any, chunk_bytes: int = 64 << 20) -> bool:
    """Whether a contiguous tensor holds nothing but what ``poison_tensor`` wrote into it,
    read a chunk at a time (no copy of its size). False for anything else: a tensor laid out
    otherwise is not read."""
    poison = 1 if T.isinstance(t, T.tensor_type) and t.dtype == torch.bool else POISON_BYTE
    return uniform_byte(t, chunk_bytes) == poison


def uniform_byte(t: Any, chunk_bytes: int = 64 << 20) -> int | None:
    """The one value of every byte of a contiguous tensor, or None: bytes that differ, or a
    tensor that is empty, laid out otherwise or a conjugate or negative view (its bytes are not
    its values). Read a chunk at a time: the least and greatest byte of each, no copy."""
    if not T.isinstance(t, T.tensor_type) or not T.numel(t) or not t.is_contiguous() or t.is_conj() or t.is_neg():
        return None
    raw = T.view(T.view(t, (-1,)), torch.uint8)
    value: int | None = None
    for lo in range(0, T.numel(raw), chunk_bytes):
        low, high = T.stack(T.aminmax(raw[lo : lo + chunk_bytes])).tolist()  # one read of the device
        if low != high or (value is not None and low != value):
            return None
        value = low
    return value


class _DeviceBytes:
    """A view of raw device memory that ``torch.as_tensor`` accepts without copying."""

    def __init__(self, address: int, size: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
        }


def poison_free_blocks(device: torch.device) -> int:
    """Fill every free block of the caching allocator on ``device`` with the poison byte;
    the bytes poisoned. The device is synchronised first: a block freed while work on
    another stream still used it is free only once that work is done."""
    if device.type != "cuda":
        return 0
    T.cuda_sync()
    # A block whose free waits on another stream's event (``record_stream``) is released at
    # the allocator's next allocation, not before: make one, so that it is free, and listed.
    T.empty(1, dtype=torch.uint8, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = 0
    for address, size in free_ranges(_snapshot(), index):
        T.fill_(T.as_tensor(_DeviceBytes(address, size), device=device), POISON_BYTE)
        total += size
    T.cuda_sync()
    return total
