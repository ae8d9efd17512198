"""Copies a worker keeps to compare with later, and the comparisons against them.

Three checks hold a copy of a call's data while the candidate runs again: its inputs before
a call (inputs are read-only), its first call's outputs (a second call on the same inputs must
give the same bytes), and an eager call's result (a graph replay must give it). On a GPU a
copy stays on the device when the device has room for it and as much again besides (for the
call that follows and its temporaries, plus ``DEVICE_RESERVE_BYTES``): a copy there costs
milliseconds. Where it does not, a large tensor's copy goes to host memory and the comparison
brings it back one bounded chunk at a time; for KernelBench's 6 GiB tensors on the H200 that
was about 2 s a copy through pageable memory, most of a correctness round. Small tensors, and
every tensor on the CPU, are cloned where they are.

Everything runs through the references in ``harness.T``, taken before any candidate code was
imported (``torch.allclose`` is watched there: a patch of it is reported as a reward hack).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .common import as_bytes, flat
from .harness import T

# From this size a copy of a device tensor lives on the host unless the device has room for it
# (below it, a device clone costs little memory and no transfer).
HOST_COPY_BYTES = 1 << 30
# What a device copy must leave free besides as much again as itself.
DEVICE_RESERVE_BYTES = 4 << 30
# The device memory one step of a comparison brings back from the host (and its temporaries).
CHUNK_BYTES = 256 << 20


def device_room(device: torch.device) -> int:
    """Bytes this process can still allocate on ``device``: the device's free memory and the
    blocks torch's allocator holds unused."""
    free, _ = T.mem_get_info(device)
    return int(free) + int(T.memory_reserved(device)) - int(T.memory_allocated(device))


def on_host(nbytes: int, room: int, host_from_bytes: int = HOST_COPY_BYTES) -> bool:
    """Whether a copy of a device tensor of ``nbytes`` goes to the host, given ``room`` free
    bytes on its device."""
    return nbytes >= host_from_bytes and room < 2 * nbytes + DEVICE_RESERVE_BYTES


def snapshot(t: torch.Tensor, host_from_bytes: int = HOST_COPY_BYTES) -> torch.Tensor:
    """A copy of ``t`` that later writes to ``t`` do not reach: beside it, or on the host when
    ``t`` is a large device tensor for which its device has no room (``on_host``)."""
    nbytes = t.numel() * t.element_size()
    if t.is_cuda and nbytes >= host_from_bytes and on_host(nbytes, device_room(t.device), host_from_bytes):
        host: torch.Tensor = T.contiguous(T.cpu(t))
        return host
    here: torch.Tensor = T.clone(t)
    return here


def _pairs(live: torch.Tensor, copy: torch.Tensor, chunk_bytes: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``live`` and ``copy`` flattened, in chunks of at most ``chunk_bytes`` each, both on
    ``live``'s device."""
    a, b = flat(live), flat(copy)
    step = max(1, chunk_bytes // max(1, live.element_size()))
    for lo in range(0, T.numel(a), step):
        part = b[lo : lo + step]
        yield a[lo : lo + step], (part if part.device == a.device else T.to(part, a.device))


def same_bytes(live: torch.Tensor, copy: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> bool:
    """Whether ``live`` holds exactly the bytes of ``copy`` (NaNs and signed zeros included)."""
    if live.shape != copy.shape or live.dtype != copy.dtype:
        return False
    return all(T.equal(as_bytes(a), as_bytes(b)) for a, b in _pairs(live, copy, chunk_bytes))


def close(live: torch.Tensor, copy: torch.Tensor, atol: float, rtol: float, chunk_bytes: int = CHUNK_BYTES) -> bool:
    """``torch.allclose(live, copy)`` with NaNs equal, floats compared as float32 (integers and
    booleans exactly), one chunk at a time."""
    if live.shape != copy.shape or live.dtype != copy.dtype:
        return False
    if not live.is_floating_point():
        return same_bytes(live, copy, chunk_bytes)
    # chunks of chunk_bytes / 4 elements, so that each float32 temporary holds chunk_bytes
    step_bytes = max(1, chunk_bytes * live.element_size() // 4)
    return all(
        bool(torch.allclose(T.to(a, torch.float32), T.to(b, torch.float32), atol=atol, rtol=rtol, equal_nan=True))
        for a, b in _pairs(live, copy, step_bytes)
    )
