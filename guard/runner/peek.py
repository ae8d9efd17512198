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

import contextlib
import itertools
import math
import os
from collections.abc import Iterator
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


# A span the guard reads whole, in elements per element of the tensor: a slice of a wider
# buffer up to this many times its size is one read (a third of a fused projection's rows: 3).
# Wider, a read per row (``MIN_ROW``); a read is charged to the candidate's window, where its
# trusted mirror reads dense outputs in one (a review of ours, session 48: 54 ms by rows
# against 6.5 ms dense for one slice).
SPAN_FACTOR = 4
# Any span up to this many bytes is read whole, however sparse: a column of a small wider buffer
# (``[N, 1]`` of ``[N, 8]``) has no rows to read and was refused as REWARD_HACK (a review of
# ours, session 48); reading this much costs a few milliseconds at most.
SMALL_SPAN_BYTES = 16 << 20


def readable_span(shape: list[int], stride: list[int], size: int = 1) -> bool:
    """Whether the guard reads a tensor so laid out whole (``size``: bytes per element): its
    storage span, first element to last, at most ``SPAN_FACTOR`` times its elements and a
    little (no more than a few times the outputs' own size may be asked of it), or at most
    ``SMALL_SPAN_BYTES``. Else it reads the rows alone, where they are long enough
    (``MIN_ROW``) and ``read_held`` allows it."""
    span = span_elements(shape, stride)
    return span <= SPAN_FACTOR * math.prod(shape) + 64 or span * size <= SMALL_SPAN_BYTES


def canonical_strides(shape: list[int], stride: list[int]) -> list[int]:
    """``stride`` with the strides of dimensions of size 0 or 1, which address nothing, set to
    the contiguous ones: a stride of 2**64 on a dimension of size 1 passed the span check (times
    zero) and then failed torch's view in the trusted worker, an error taken for the guard's own
    (red team, session 48)."""
    dense = contiguous_strides(shape)
    empty = any(size == 0 for size in shape)
    return [d if empty or size <= 1 else st for size, st, d in zip(shape, stride, dense)]


def contiguous_strides(shape: list[int]) -> list[int]:
    """The strides of a contiguous tensor of ``shape``, in elements."""
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= max(1, size)
    return strides


def read_held(
    pid: int,
    held: list[m.HeldOutput | None],
    expected: list[tuple[list[int], str]],
    dest: Path,
    tag: str,
    rows: bool = True,
) -> list[m.ReadOutput | None]:
    """Each held output of one call, read from ``pid``'s memory into a file in ``dest``
    (``rows``: an output too wide to read whole may be read row by row; the timed loop's
    outputs are dense copies, and a description that asks for rows there is refused).
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
            if len(h.stride) != len(shape):
                raise PeekError(f"output {j}: {len(h.stride)} strides for shape {shape}")
            stride = canonical_strides(shape, h.stride)
            span = span_elements(shape, stride)
            if h.address + span * int(size) > m.MEMORY_LIMIT:
                raise PeekError(f"output {j}: {span} elements at {h.address:#x}, past any address")
            path = dest / f"{tag}_{j}.bin"
            if readable_span(shape, stride, int(size)):
                _copy_out(fd, h.address, span * int(size), path)
                out.append(m.ReadOutput(file=str(path), span=span, shape=shape, stride=stride, dtype=dtype))
            elif rows and stride[-1:] == [1] and shape[-1] >= MIN_ROW:
                # rows of a wider buffer (a slice of a fused projection's output): each row read
                # alone, the elements and nothing between them
                _copy_rows(fd, h.address, shape, stride, int(size), path)
                numel = math.prod(shape)
                out.append(
                    m.ReadOutput(file=str(path), span=numel, shape=shape, stride=contiguous_strides(shape), dtype=dtype)
                )
            else:
                raise PeekError(
                    f"output {j}: strides {h.stride} span {span} elements for shape {shape}, and its rows "
                    f"are not runs of at least {MIN_ROW} elements"
                )
    finally:
        os.close(fd)
    return out


def _open_mem(pid: int) -> int:
    try:
        return os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as exc:
        # the guard's own limit (a kernel that forbids it): not the candidate's doing
        raise OSError(exc.errno, f"cannot read the candidate worker's memory: {exc.strerror}") from None


# The shortest rows the guard reads one at a time from an output whose span is too wide to read
# whole: a read per row, so at most one for this many elements.
MIN_ROW = 16


def _copy_rows(fd: int, address: int, shape: list[int], stride: list[int], size: int, path: Path) -> None:
    """The rows (last dimension, contiguous) of a tensor at ``address``, one after another into
    a new file at ``path``."""
    row_bytes = shape[-1] * size
    with _new_file(path) as out:
        for index in itertools.product(*(range(n) for n in shape[:-1])):
            _write_all(out, _pread(fd, row_bytes, address + size * sum(i * st for i, st in zip(index, stride))))


def _copy_out(fd: int, address: int, nbytes: int, path: Path) -> None:
    """``nbytes`` at ``address`` into a new file at ``path``, a chunk at a time."""
    chunk = 8 << 20
    with _new_file(path) as out:
        for done in range(0, nbytes, chunk):
            _write_all(out, _pread(fd, min(chunk, nbytes - done), address + done))


def _pread(fd: int, nbytes: int, at: int) -> bytes:
    """All ``nbytes`` at ``at`` in the worker's memory; PeekError where they are not there (the
    candidate chose the address)."""
    try:
        data = os.pread(fd, nbytes, at)
    except OSError as exc:
        raise PeekError(f"nothing readable at {at:#x} ({exc.strerror})") from None
    except (OverflowError, ValueError) as exc:
        raise PeekError(f"no address {at:#x}: {exc}") from None
    if len(data) != nbytes:
        raise PeekError(f"nothing readable at {at + len(data):#x}")
    return data


@contextlib.contextmanager
def _new_file(path: Path) -> Iterator[int]:
    out = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        yield out
    finally:
        os.close(out)


def _write_all(out: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(out, view) :]
