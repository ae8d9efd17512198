"""Tensors as raw files: how candidate outputs travel from a candidate worker to the trusted
one. Plain bytes plus a small JSON description, checked against the size before reading;
nothing is unpickled."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any

import torch

from .common import as_bytes, dtype_name, flat
from .harness import T

ELEMENT_SIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
_OS_OPEN, _OS_WRITE, _OS_CLOSE = os.open, os.write, os.close
# A device tensor goes to and from its file through one page-locked host buffer of at most
# this size, a chunk at a time: the device copies into page-locked memory at the link's speed,
# and torch keeps the buffer for the next round instead of pinning gigabytes afresh. Through
# freshly allocated pageable memory a 6 GiB output took most of a large problem's correctness
# time on the H200 (KernelBench ReLU: 70 s of checks and 76 s of comparisons for 6 rounds).
STAGE_BYTES = 256 << 20


def _stage(nbytes: int, stage_bytes: int) -> torch.Tensor:
    """A host buffer for a transfer of ``nbytes`` in chunks of ``stage_bytes``: page-locked
    where there is a GPU to copy from or to."""
    pinned = torch.cuda.is_available()
    stage: torch.Tensor = T.empty((max(1, min(nbytes, stage_bytes)),), dtype=torch.uint8, pin_memory=pinned)
    return stage


def _write_staged(fd: int, raw: torch.Tensor, stage_bytes: int) -> None:
    """Write the flat bytes ``raw`` (on any device) a chunk at a time through a host buffer."""
    nbytes = T.numel(raw)
    stage = _stage(nbytes, stage_bytes)
    step = T.numel(stage)
    for lo in range(0, nbytes, step):
        part = raw[lo : lo + step]
        k = T.numel(part)
        T.copy_(stage[:k], part)  # into page-locked memory: returns when copied
        _write_all(fd, memoryview(T.numpy(stage[:k])))


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = _OS_WRITE(fd, view)
        view = view[n:]


def write_tensor(t: torch.Tensor, path: Path, stage_bytes: int = STAGE_BYTES) -> dict[str, Any]:
    """Write ``t``'s bytes to ``path``; returns the description. A device tensor is copied
    out a chunk at a time through a page-locked buffer."""
    fd = _OS_OPEN(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if T.numel(t):
            raw = as_bytes(flat(t))
            if raw.device.type == "cpu":
                _write_all(fd, memoryview(T.numpy(raw)))
            else:
                _write_staged(fd, raw, stage_bytes)
    finally:
        _OS_CLOSE(fd)
    return {"file": str(path), "shape": list(t.shape), "dtype": dtype_name(t)}


def read_tensor(meta: dict[str, Any], device: str, stage_bytes: int = STAGE_BYTES) -> torch.Tensor:
    """Read a described tensor; refuses files whose size disagrees with the description."""
    dtype = meta.get("dtype")
    shape = meta.get("shape")
    if (
        dtype not in ELEMENT_SIZE
        or not isinstance(shape, list)
        or not all(isinstance(d, int) and d >= 0 for d in shape)
    ):
        raise ValueError(f"bad tensor description {str(meta)[:200]}")
    expected = math.prod(shape) * ELEMENT_SIZE[dtype]
    path = Path(meta["file"])
    # The candidate wrote the folder this file is in: never follow a link it may have put there,
    # as the file or as the folder itself (its ``out`` replaced by a link led the unconfined
    # trusted worker anywhere on the host: red team, session 45), never wait on a FIFO it put
    # there (opening one blocks until a writer comes: a red team so hung the trusted worker and
    # withheld its verdict), and read only a plain file of the announced size.
    try:
        folder = os.open(str(path.parent), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError as exc:
        raise ValueError(f"{path.name}: cannot be opened as a plain file ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path.name}: not a plain file")
        if st.st_size != expected:
            raise ValueError(f"{path.name}: {st.st_size} bytes, expected {expected} for {shape} {dtype}")
        if expected == 0:
            return torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        if device.startswith("cuda"):
            raw = _read_staged(fd, path, expected, device, stage_bytes)
        else:
            # straight into an uninitialised host tensor: no zeroing of what the read overwrites
            raw = torch.empty(expected, dtype=torch.uint8)
            _read_into(fd, path, raw)
    finally:
        os.close(fd)
    return raw.view(getattr(torch, dtype)).reshape(shape)


def _read_into(fd: int, path: Path, host: torch.Tensor) -> None:
    view, got, want = host.numpy().data, 0, host.numel()
    while got < want:
        n = os.readv(fd, [view[got:]])
        if n <= 0:
            raise ValueError(f"{path.name}: shorter than announced")
        got += n


def _read_staged(fd: int, path: Path, nbytes: int, device: str, stage_bytes: int) -> torch.Tensor:
    """The file's bytes in a new tensor on ``device``, read a chunk at a time into a host
    buffer and copied from there (no host copy of the whole)."""
    out = torch.empty(nbytes, dtype=torch.uint8, device=device)
    stage = _stage(nbytes, stage_bytes)
    step = stage.numel()
    for lo in range(0, nbytes, step):
        k = min(step, nbytes - lo)
        _read_into(fd, path, stage[:k])
        out[lo : lo + k].copy_(stage[:k])  # from page-locked memory, synchronous: the buffer is reused next
    return out
