"""Stored inputs (safetensors files) read and written byte for byte, without torch: the
server imports problems, and torch is never imported there.

The format: an 8-byte little-endian header size, a JSON header naming each tensor's dtype,
shape and byte range in the data that follows, then the data.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from pathlib import Path
from typing import Any

METADATA = "__metadata__"
MAX_HEADER_BYTES = 100 << 20  # the format's own limit


class BlobError(ValueError):
    """A file that is not a safetensors file this module can read."""


def header(path: Path) -> dict[str, Any]:
    """The JSON header of the safetensors file ``path``."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise BlobError(f"{path}: not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", raw)
        if size > MAX_HEADER_BYTES:
            raise BlobError(f"{path}: not a safetensors file (a header of {size} bytes)")
        try:
            parsed = json.loads(f.read(size))
        except ValueError as exc:
            raise BlobError(f"{path}: not a safetensors file ({exc})") from None
    if not isinstance(parsed, dict):
        raise BlobError(f"{path}: not a safetensors file (its header is no mapping)")
    return parsed


def tensor_keys(path: Path) -> frozenset[str]:
    """The names of the tensors the file holds. Every evaluation asks for each stored input
    of its problem (``derive``): the header is read once per version of the file (its path,
    size and modification time)."""
    st = os.stat(path)
    return _tensor_keys(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=512)
def _tensor_keys(path: str, size: int, mtime_ns: int) -> frozenset[str]:
    return frozenset(k for k in header(Path(path)) if k != METADATA)


def write_subset(src: Path, dest: Path, keep: set[str]) -> list[str]:
    """Write to ``dest`` a safetensors file holding only the tensors of ``src`` named in
    ``keep`` (their bytes unchanged, offsets renumbered; no metadata). Returns the names of
    ``keep`` that ``src`` lacks."""
    head = header(src)
    with open(src, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        base = 8 + size
        new: dict[str, Any] = {}
        chunks: list[bytes] = []
        offset = 0
        for key in sorted(k for k in keep if k in head and k != METADATA):
            meta = head[key]
            start, end = (int(x) for x in meta["data_offsets"])
            if not 0 <= start <= end:
                raise BlobError(f"{src}: tensor {key!r} has offsets {start}..{end}")
            f.seek(base + start)
            data = f.read(end - start)
            if len(data) != end - start:
                raise BlobError(f"{src}: tensor {key!r} runs past the end of the file")
            new[key] = {**meta, "data_offsets": [offset, offset + len(data)]}
            chunks.append(data)
            offset += len(data)
    raw = json.dumps(new).encode()
    raw += b" " * (-len(raw) % 8)  # the data stays 8-byte aligned, as writers keep it
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for data in chunks:
            out.write(data)
    return sorted(k for k in keep if k not in head)
