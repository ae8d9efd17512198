"""Copies a worker keeps to compare with later, and the comparisons against them.

Three checks hold a copy of a call's data while the candidate runs again: its inputs before
a call (inputs are read-only), its first call's outputs (a second call on the same inputs must
give the same bytes), and an eager call's result (a graph replay must give it). On a GPU the
copies of one step stay on the device when the device has room for all of them, for twice
the call's own data besides (the call's outputs and temporaries, and the other worker making
a reference beside it) and for ``DEVICE_RESERVE_BYTES``: a copy there costs milliseconds.
Where it does not, a large tensor's copy goes to host memory and the comparison brings it
back one bounded chunk at a time; on the H200 that was about 2.4 s per 7 GiB through pageable
memory (docs/kernelbench.md, run 7), most of a correctness round. Small tensors, and every
tensor on the CPU, are cloned where they are. The decision uses only the device's free
memory (the allocator's unused cache is not counted: the worker empties it after large
rounds), and any failure to read it means the host.

Everything runs through the references in ``harness.T``, taken before any candidate code was
imported (``torch.allclose`` is watched there: a patch of it is reported as a reward hack).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .common import as_bytes, flat
from .harness import T

# From this size a copy of a device tensor lives on the host unless the device has room for it
# (below it, a device clone costs little memory and no transfer).
HOST_COPY_BYTES = 1 << 30
# What device copies must leave free besides twice the call's own data.
DEVICE_RESERVE_BYTES = 4 << 30
# The device memory one step of a comparison brings back from the host (and its temporaries).
CHUNK_BYTES = 256 << 20
# float32 tensors the size of a chunk that one ``close`` step makes: ``torch.allclose`` makes
# four (the difference, its bound, their comparison: 1 GiB for a 256 MiB float32 chunk of a
# conv3d's output on the H200, the largest holder of the candidate's peak), and a narrower
# float its two float32 copies first.
CLOSE_TEMPORARIES = 6


def device_room(device: torch.device) -> int:
    """Free bytes on ``device``, 0 where they cannot be read (the copies then go to the host)."""
    if T.cuda_mem_get_info is None:
        return 0
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        free, _ = T.cuda_mem_get_info(index)
        return int(free)
    except Exception:  # noqa: BLE001 - the host is always a safe place for a copy
        return 0


def on_host(copy_bytes: int, call_bytes: int, room: int) -> bool:
    """Whether copies of ``copy_bytes`` in all go to the host, given ``room`` free bytes on the
    device and a call of ``call_bytes`` (its inputs and outputs) to run beside them."""
    return room < copy_bytes + 2 * call_bytes + DEVICE_RESERVE_BYTES


def snapshots(ts: list[Any], call_bytes: int, host_from_bytes: int = HOST_COPY_BYTES) -> list[Any]:
    """Copies of the tensors among ``ts`` (anything else passed through) that later writes do
    not reach, decided together: the large device ones (``host_from_bytes`` and more) stay on
    the device only when it has room for all of them (``on_host``); the rest are cloned where
    they are."""
    large = [
        T.isinstance(t, T.tensor_type) and t.is_cuda and t.numel() * t.element_size() >= host_from_bytes for t in ts
    ]
    total = sum(t.numel() * t.element_size() for t, big in zip(ts, large) if big)
    first = next((t for t, big in zip(ts, large) if big), None)
    host = first is not None and on_host(total, call_bytes, device_room(first.device))
    return [_copy(t, host and big) if T.isinstance(t, T.tensor_type) else t for t, big in zip(ts, large)]


def _copy(t: torch.Tensor, host: bool) -> torch.Tensor:
    if host:
        on: torch.Tensor = T.contiguous(T.cpu(t))
        return on
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
    # chunks whose float32 temporaries together hold at most chunk_bytes
    step_bytes = max(1, chunk_bytes * live.element_size() // (4 * CLOSE_TEMPORARIES))
    return all(
        bool(torch.allclose(T.to(a, torch.float32), T.to(b, torch.float32), atol=atol, rtol=rtol, equal_nan=True))
        for a, b in _pairs(live, copy, step_bytes)
    )
