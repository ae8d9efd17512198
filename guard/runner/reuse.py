"""Memory a kernel returned again: a call's outputs in bytes that an earlier call's outputs,
still held by the guard, were returned in. No allocator hands out memory that is held, so only
a kernel that keeps a buffer and computes into it again lands there, and a caller that kept
the earlier answer loses it. Asked of tensors by the correctness gate on a CPU
(``CandidateRole.check``: the rounds of one check) and of descriptions by the outside clock's
windows (``cascade.held_outputs.returned_again``: the calls of one window). Free of torch: the
guard's side uses it too.
"""

from __future__ import annotations

import itertools
import math

from .peek import canonical_strides, span_elements

# (first byte, end, call, output): one output of one call, where it lies
Span = tuple[int, int, int, int]


def dense_bytes(address: int, shape: list[int], stride: list[int], itemsize: int) -> tuple[int, int] | None:
    """The bytes of a dense, non-empty tensor at ``address``; None for anything else. A strided
    tensor's span holds bytes that are not its own (two column slices of one arena buffer
    interleave without sharing an element, and are not memory returned again)."""
    numel = math.prod(shape)
    if address <= 0 or numel == 0 or len(stride) != len(shape):
        return None
    if span_elements(shape, canonical_strides(shape, stride)) != numel:
        return None
    return address, address + numel * itemsize


def first_reuse(spans: list[Span]) -> tuple[int, int, int] | None:
    """(earlier call, later call, the later call's output) for the first two spans of different
    calls that share a byte, or None. One call's outputs may share memory with each other."""
    far: tuple[int, int, int] | None = None  # (end, call, output) of the span reaching furthest yet
    for start, end, call, output in sorted(spans):
        if far is not None and start < far[0] and far[1] != call:
            later = max((call, output), (far[1], far[2]))
            return min(call, far[1]), later[0], later[1]
        if far is None or end > far[0]:
            far = (end, call, output)
    return None


# (address, shape, stride, bytes per element): a tensor's layout in memory
Layout = tuple[int, list[int], list[int], int]
# the largest joint span and the most rows that ``share_elements`` marks out one by one; past
# them it answers as a storage would (shared), the guard's old rule
MASK_BYTES = 64 << 20
MASK_ROWS = 1 << 16


def share_elements(a: Layout, b: Layout) -> bool:
    """Whether two tensors have a byte of an element in common. Their spans first; two dense
    ones whose spans meet do; otherwise their rows (last dimension, contiguous) are marked out
    in a mask of their joint span, so that two column blocks of one wide buffer (a fused
    projection's outputs: a red team's, session 49) are told apart. A layout without such rows,
    or too large to mark, counts as shared."""
    spans = []
    for address, shape, stride, size in (a, b):
        if math.prod(shape) == 0:
            return False
        if len(stride) != len(shape):
            return True
        strides = canonical_strides(shape, stride)
        spans.append((address, address + span_elements(shape, strides) * size, shape, strides, size))
    (lo_a, hi_a, *_), (lo_b, hi_b, *_) = spans
    if hi_a <= lo_b or hi_b <= lo_a:
        return False
    if all(span_elements(shape, st) == math.prod(shape) for _, _, shape, st, _ in spans):
        return True
    lo, hi = min(lo_a, lo_b), max(hi_a, hi_b)
    rows = [math.prod(shape[:-1]) for _, _, shape, _, _ in spans]
    if hi - lo > MASK_BYTES or max(rows) > MASK_ROWS or any(st[-1] != 1 for _, _, _, st, _ in spans):
        return True
    mask = bytearray(hi - lo)
    (start_a, _, shape_a, st_a, size_a), (start_b, _, shape_b, st_b, size_b) = spans
    width = shape_a[-1] * size_a
    for at in _row_starts(start_a - lo, shape_a, st_a, size_a):
        mask[at : at + width] = b"\x01" * width
    width = shape_b[-1] * size_b
    return any(mask.find(1, at, at + width) != -1 for at in _row_starts(start_b - lo, shape_b, st_b, size_b))


def _row_starts(base: int, shape: list[int], stride: list[int], size: int) -> list[int]:
    """The byte offset of every row (last dimension) of a tensor whose first element is at ``base``."""
    return [
        base + size * sum(i * st for i, st in zip(index, stride))
        for index in itertools.product(*map(range, shape[:-1]))
    ]
