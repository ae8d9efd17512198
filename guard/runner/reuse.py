"""Memory a kernel returned again: a call's outputs in elements that an earlier call's outputs,
still held by the guard, were returned in. No allocator hands out memory that is held, so only
a kernel that keeps a buffer and computes into it again lands there, and a caller that kept
the earlier answer loses it. Asked of tensors by the correctness gate on a CPU
(``CandidateRole.check``: the rounds of one check) and of descriptions by the outside clock's
windows (``cascade.held_outputs.returned_again``: the calls of one window). Free of torch: the
guard's side uses it too.

Elements, not spans: a strided output's span holds bytes that are not its own (two column
slices of one wide buffer interleave without sharing an element). Dense outputs alone were
compared at first, and a kernel that kept a strided buffer (``buf[:, :n]`` of a wider one) was
named by neither check, and REWARD_HACK in the windows (red team, session 49).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

from .peek import canonical_strides, span_elements

# (address, shape, stride, bytes per element): a tensor's layout in memory
Layout = tuple[int, list[int], list[int], int]
# the largest joint span and the most rows that ``elements_shared`` marks out one by one for a
# pair; past them it cannot tell
MASK_BYTES = 64 << 20
MASK_ROWS = 1 << 16
# what one search of ``first_reuse`` marks, all its pairs together (a window holds up to 4096
# calls, and an arena handing every call a column slice of one buffer puts them all in one
# span: pairs by the million), and the rows a pair is charged besides its own, for looking at
# it: half a second at most, seen on a 2-core machine with another job running (the largest
# pairs marked, or 4096 calls of one arena). Past it, what is undecided stays so.
SEARCH_ROWS = 4 * MASK_ROWS
SEARCH_BYTES = 4 * MASK_BYTES
PAIR_ROWS = 16


class Marking:
    """What a search may still mark (``first_reuse``): rows and mask bytes. A pair that does
    not fit what is left ends it, so that every pair looked at after is undecided alike."""

    def __init__(self, rows: int = SEARCH_ROWS, nbytes: int = SEARCH_BYTES) -> None:
        self.rows = rows
        self.nbytes = nbytes

    @property
    def left(self) -> bool:
        return self.rows > 0

    def take(self, rows: int, nbytes: int) -> bool:
        """Whether ``rows`` and ``nbytes`` fit what is left, taken from it if so."""
        if rows > self.rows or nbytes > self.nbytes:
            self.rows = self.nbytes = 0
            return False
        self.rows -= rows
        self.nbytes -= nbytes
        return True


def elements_shared(a: Layout, b: Layout, marking: Marking | None = None) -> bool | None:
    """Whether two tensors have a byte of an element in common, or None where it cannot tell.
    Their spans first; two whose first elements lie at one address do, and so do two dense
    ones whose spans meet; otherwise their rows (last dimension, contiguous) are marked out in
    a mask of their joint span, so that two column blocks of one wide buffer (a fused
    projection's outputs: a red team's, session 49) are told apart. Undecided: a layout
    without such rows, or too large to mark (``MASK_BYTES``, ``MASK_ROWS``), or past what
    ``marking`` has left. Each caller says what undecided means to it (``share_elements``,
    ``first_reuse``)."""
    spans = []
    for address, shape, stride, size in (a, b):
        if math.prod(shape) == 0:
            return False
        if len(stride) != len(shape):
            return None
        strides = canonical_strides(shape, stride)
        spans.append((address, address + span_elements(shape, strides) * size, shape, strides, size))
    (lo_a, hi_a, *_), (lo_b, hi_b, *_) = spans
    if hi_a <= lo_b or hi_b <= lo_a:
        return False
    # strides are never negative: a tensor's first element lies at its address
    if lo_a == lo_b or all(span_elements(shape, st) == math.prod(shape) for _, _, shape, st, _ in spans):
        return True
    lo, hi = min(lo_a, lo_b), max(hi_a, hi_b)
    rows = [math.prod(shape[:-1]) for _, _, shape, _, _ in spans]
    markable = hi - lo <= MASK_BYTES and max(rows) <= MASK_ROWS and all(st[-1] == 1 for _, _, _, st, _ in spans)
    # a pair that cannot be marked is charged for being looked at alone
    rows_cost, bytes_cost = (PAIR_ROWS + sum(rows), hi - lo) if markable else (PAIR_ROWS, 0)
    if marking is not None and not marking.take(rows_cost, bytes_cost):
        return None
    if not markable:
        return None
    mask = bytearray(hi - lo)
    (start_a, _, shape_a, st_a, size_a), (start_b, _, shape_b, st_b, size_b) = spans
    width = shape_a[-1] * size_a
    for at in _row_starts(start_a - lo, shape_a, st_a, size_a):
        mask[at : at + width] = b"\x01" * width
    width = shape_b[-1] * size_b
    return any(mask.find(1, at, at + width) != -1 for at in _row_starts(start_b - lo, shape_b, st_b, size_b))


def share_elements(a: Layout, b: Layout) -> bool:
    """Whether two outputs of one call share memory (``elements_shared``). Where that cannot be
    told they count as sharing: the guard's rule from before elements were compared (session
    49), whole storages then."""
    return elements_shared(a, b) is not False


class _Placed(NamedTuple):
    """One output of one call, where it lies: its span's first byte and end."""

    start: int
    end: int
    call: int
    output: int
    layout: Layout
    dense: bool


def first_reuse(
    calls: Sequence[tuple[int, Sequence[Layout | None]]], marking: Marking | None = None
) -> tuple[int, int, int] | None:
    """(earlier call, later call, the later call's output) for two outputs of different calls
    that share an element (``elements_shared``), or None. ``calls``: each call's index and its
    outputs' layouts (None: not looked at); ``marking``: what the search may mark (a new
    ``Marking`` unless given). One call's outputs may share memory with each other.

    Undecided counts as not reused here, the opposite of ``share_elements``: a false "reused"
    would call an honest kernel's answers overwritten (an arena handing every call a column
    slice of one buffer interleaves, and a layout past what can be marked may do so too), while
    a kernel that did reuse its buffer is still caught after, as every strided output once was:
    the windows read a later call's answer for its call (REWARD_HACK, "behaves differently
    while timed"). A kernel that keeps its buffer returns the same layout every
    call, which is decided whatever its strides (one address).

    The spans swept in order, each looked at against the earlier ones that reach it (alone
    those can share an element): dense against dense decided at once, and strided pairs marked
    (``Marking``: a search of thousands of calls costs no more than a few pairs of the largest).
    Once that is spent, strided outputs are looked at by their first element alone."""
    placed = []
    for call, layouts in calls:
        for j, layout in enumerate(layouts):
            if layout is None or (where := _span(layout)) is None:
                continue
            start, end = where
            placed.append(_Placed(start, end, call, j, layout, end - start == math.prod(layout[1]) * layout[3]))
    placed.sort()
    if marking is None:
        marking = Marking()
    # (end, order, output): the outputs looked at whose spans may reach the next one
    active: list[tuple[int, int, _Placed]] = []
    here: _Placed | None = None  # the first output whose span starts where the current one's does
    spent = False  # the marking, and the strided outputs left out of ``active`` since
    for order, p in enumerate(placed):
        if here is None or here.start != p.start:
            here = p
        elif here.call != p.call:
            return _named(here, p)
        while active and active[0][0] <= p.start:
            heapq.heappop(active)
        for _, _, q in active:
            if q.call != p.call and elements_shared(q.layout, p.layout, marking):
                return _named(q, p)
        if p.dense or marking.left:
            heapq.heappush(active, (p.end, order, p))
        if not marking.left and not spent:
            spent = True
            active = [entry for entry in active if entry[2].dense]
            heapq.heapify(active)
    return None


def _span(layout: Layout) -> tuple[int, int] | None:
    """A non-empty tensor's span: its first byte and end; None for one without elements or
    memory, or with strides that do not fit its shape."""
    address, shape, stride, size = layout
    if address <= 0 or math.prod(shape) == 0 or len(stride) != len(shape):
        return None
    return address, address + span_elements(shape, canonical_strides(shape, stride)) * size


def _named(a: _Placed, b: _Placed) -> tuple[int, int, int]:
    """(earlier call, later call, the later call's output) of two outputs of different calls."""
    later = max((a.call, a.output), (b.call, b.output))
    return min(a.call, b.call), later[0], later[1]


def _row_starts(base: int, shape: list[int], stride: list[int], size: int) -> list[int]:
    """The byte offset of every row (last dimension) of a tensor whose first element is at ``base``."""
    return [
        base + size * sum(i * st for i, st in zip(index, stride))
        for index in itertools.product(*map(range, shape[:-1]))
    ]
