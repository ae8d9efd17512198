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

from .common import dtype_name
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
# Page-locked host buffers (torch caches them for reuse) up to this size: beyond it, pinning a
# fresh buffer costs more than the faster copy saves, and the cache would keep gigabytes.
PINNED_MAX_BYTES = 256 << 20


def write_tensor(t: torch.Tensor, path: Path) -> dict[str, Any]:
    """Copy ``t`` to host and write its bytes; returns the description. From a GPU through
    page-locked memory, which the device copies into at full speed (torch caches such blocks)."""
    if t.is_cuda and t.numel() * t.element_size() <= PINNED_MAX_BYTES:
        host = T.empty(tuple(t.shape), dtype=t.dtype, pin_memory=True)
        T.copy_(host, t)
    else:
        host = T.contiguous(T.cpu(t))
    raw = T.numpy(T.view(T.view(host, (-1,)), torch.uint8)) if host.numel() else None
    fd = _OS_OPEN(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if raw is not None:
            view = memoryview(raw)
            while view:
                n = _OS_WRITE(fd, view)
                view = view[n:]
    finally:
        _OS_CLOSE(fd)
    return {"file": str(path), "shape": list(t.shape), "dtype": dtype_name(t)}


def read_tensor(meta: dict[str, Any], device: str) -> torch.Tensor:
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
    # The candidate wrote the folder this file is in: never follow a link it may have put there
    # (to the secret, say), never wait on a FIFO it put there (opening one blocks until a writer
    # comes: a red team so hung the trusted worker and withheld its verdict), and read only a
    # plain file of the announced size.
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
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
        # read straight into an uninitialised (page-locked, for a GPU) host tensor: no zeroing
        # of a buffer the read overwrites, and the copy to the device at full speed
        pinned = device.startswith("cuda") and expected <= PINNED_MAX_BYTES
        host = torch.empty(expected, dtype=torch.uint8, pin_memory=pinned)
        view, got = host.numpy().data, 0
        while got < expected:
            n = os.readv(fd, [view[got:]])
            if n <= 0:
                raise ValueError(f"{path.name}: shorter than announced")
            got += n
    finally:
        os.close(fd)
    return host.view(getattr(torch, dtype)).reshape(shape).to(device)
