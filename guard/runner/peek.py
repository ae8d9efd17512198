"""Reading a stopped candidate worker's outputs out of its memory (``runner/kept.py`` says why).

The guard is the worker's ancestor and runs as the same user, and the sandbox's user namespace
is its child: the kernel lets it read ``/proc/PID/mem`` of the worker's process (checked on the
CPU machines and the H200: ``benchmarks/procmem_probe.py``). The worker names its process by
the id its own PID namespace gives it; the guard finds that process in the worker's tree. The
candidate's process chooses both the process and the addresses, which only says where to look:
whatever is read there is checked against the reference on that call's inputs, and it is read
while every process of the tree is stopped, after the guard's clock took the loop's time.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..problems.dtypes import dtype_info
from . import messages as m
from .proc_tree import tree


class PeekError(Exception):
    """The candidate's description cannot be read as it says (its process's doing)."""


def process_with_ns_pid(root: int, ns_pid: int) -> int:
    """The process of ``root``'s tree that its innermost PID namespace numbers ``ns_pid``."""
    numbered = False
    for pid in tree(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                numbered = True
                ids = line.split()[1:]
                if ids and ids[-1] == str(ns_pid):
                    return pid
    if not numbered:  # a kernel before 4.1 says nothing of namespaces: the guard's limit
        raise OSError(f"no process of tree {root} shows its PID namespace ids (NSpid)")
    raise PeekError(f"the worker named process {ns_pid}, which is not in its tree")


def span_elements(shape: list[int], stride: list[int]) -> int:
    """Elements from a tensor's first to its last, by its strides (0 when empty)."""
    if len(shape) != len(stride):
        raise PeekError(f"shape {shape} with {len(stride)} strides")
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def contiguous_strides(shape: list[int]) -> list[int]:
    """The strides of a contiguous tensor of ``shape``, in elements."""
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= max(1, size)
    return strides


def read_held(
    pid: int, held: list[m.HeldOutput | None], expected: list[tuple[list[int], str]], dest: Path, tag: str
) -> list[m.ReadOutput | None]:
    """Each held output of one call, read from ``pid``'s memory into a file in ``dest``.
    ``expected``: per output, the definition's shape and dtype; a description that differs, or
    whose storage reaches further than a dense tensor of that shape would, is refused before
    anything is read (the guard reads no more than the outputs' own size)."""
    if len(held) != len(expected):
        raise PeekError(f"{len(held)} outputs held where the definition has {len(expected)}")
    out: list[m.ReadOutput | None] = []
    fd = _open_mem(pid)
    try:
        for j, (h, (shape, dtype)) in enumerate(zip(held, expected)):
            if h is None:
                out.append(None)
                continue
            if h.shape != shape or h.dtype != dtype:
                raise PeekError(f"output {j} held as {h.dtype} {h.shape}, defined as {dtype} {shape}")
            size = dtype_info(dtype).bytes
            if size != int(size) or size < 1:
                raise PeekError(f"output {j}: {dtype} is not read out of memory")
            span = span_elements(h.shape, h.stride)
            if span > 2 * math.prod(shape) + 64:
                raise PeekError(f"output {j}: strides {h.stride} span {span} elements for shape {shape}")
            path = dest / f"{tag}_{j}.bin"
            _copy_out(fd, h.address, span * int(size), path)
            out.append(m.ReadOutput(file=str(path), span=span, shape=shape, stride=h.stride, dtype=dtype))
    finally:
        os.close(fd)
    return out


def _open_mem(pid: int) -> int:
    try:
        return os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as exc:
        # the guard's own limit (a kernel that forbids it): not the candidate's doing
        raise OSError(exc.errno, f"cannot read the candidate worker's memory: {exc.strerror}") from None


def _copy_out(fd: int, address: int, nbytes: int, path: Path) -> None:
    """``nbytes`` at ``address`` into a new file at ``path``, a chunk at a time."""
    chunk = 8 << 20
    out = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        done = 0
        while done < nbytes:
            want = min(chunk, nbytes - done)
            try:
                data = os.pread(fd, want, address + done)
            except OSError as exc:
                raise PeekError(f"nothing readable at {address + done:#x} ({exc.strerror})") from None
            if not data:
                raise PeekError(f"nothing readable at {address + done:#x}")
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
            done += len(data)
    finally:
        os.close(out)
