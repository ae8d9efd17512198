"""Memory a kernel returned again: a call's outputs in bytes that an earlier call's outputs,
still held by the guard, were returned in. No allocator hands out memory that is held, so only
a kernel that keeps a buffer and computes into it again lands there, and a caller that kept
the earlier answer loses it. Asked of tensors by the correctness gate on a CPU
(``CandidateRole.check``: the rounds of one check) and of descriptions by the outside clock's
windows (``cascade.held_outputs.returned_again``: the calls of one window). Free of torch: the
guard's side uses it too.
"""

from __future__ import annotations

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
