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
# span: pairs by the million), charged each pair's rows and what it writes and scans (rows
# that overlap write more than their span): half a second at most, seen on a 2-core machine
# with another job running (the largest pairs marked). Past it, what is undecided stays so.
SEARCH_ROWS = 4 * MASK_ROWS
SEARCH_BYTES = 4 * MASK_BYTES
# the pairs of strided outputs one search looks at, marked or not (about 17 us each
# when not); apart from the marking's rows and bytes, so that a few large pairs marked first
# (a review of ours, session 50: six calls' blocks of a wide buffer) leave the rest looked at
SEARCH_PAIRS = 1 << 14


class Marking:
    """What a search may still do (``first_reuse``): pairs to look at, and rows and mask bytes
    to mark. A pair that does not fit what is left of the marking ends it, so that every pair
    looked at after is marked alike (not at all)."""

    def __init__(self, rows: int = SEARCH_ROWS, nbytes: int = SEARCH_BYTES, pairs: int = SEARCH_PAIRS) -> None:
        self.rows = rows
        self.nbytes = nbytes
        self.pairs = pairs

    @property
    def left(self) -> bool:
        """Whether pairs are left to look at."""
        return self.pairs > 0

    def take_pair(self) -> bool:
        """Whether a pair may be looked at, counted if so."""
        self.pairs -= 1
        return self.pairs >= 0

    def take(self, rows: int, nbytes: int) -> bool:
        """Whether ``rows`` and ``nbytes`` fit what is left to mark, taken from it if so."""
        if rows > self.rows or nbytes > self.nbytes:
            self.rows = self.nbytes = 0
            return False
        self.rows -= rows
        self.nbytes -= nbytes
        return True


def elements_shared(a: Layout, b: Layout, marking: Marking | None = None) -> bool | None:
    """Whether two tensors have a byte of an element in common, or None where it cannot tell.
    Their spans first; two whose first elements lie at one address do, and so do two dense
    ones whose spans meet. Two of one layout (shape, strides and element size: a kept buffer
    handed out again a few elements further along) are decided from the distance between
    them (``_reaches``). Otherwise their rows (last dimension, contiguous; single elements
    where it is not) are marked out in a mask of their joint span, so that two column blocks
    of one wide buffer (a fused projection's outputs: a red team's, session 49) are told
    apart. Undecided: a layout whose elements may overlap each other, or too large to mark
    (``MASK_BYTES``, ``MASK_ROWS``), or past what ``marking`` has left. Each caller says what
    undecided means to it (``share_elements``, ``first_reuse``)."""
    spans = []
    for layout in (a, b):
        if math.prod(layout[1]) == 0:
            return False
        if (normal := _normal(layout)) is None:
            return None
        spans.append(normal)
    return _shared(spans[0], spans[1], marking)


# (first byte, end, dims, strides, bytes per element): a non-empty layout as ``_shared`` takes
# it, dimensions of size 1 left out and its last one contiguous (``_normal``)
_Normal = tuple[int, int, list[int], list[int], int]


def _normal(layout: Layout) -> _Normal | None:
    """A non-empty layout as ``_shared`` compares it; None where its strides do not fit its
    shape. Dimensions of size 1 address nothing; a last dimension that is not contiguous is
    marked element by element (a trailing dimension of one); a 0-d tensor is one element."""
    address, shape, stride, size = layout
    if len(stride) != len(shape):
        return None
    kept = [(n, st) for n, st in zip(shape, canonical_strides(shape, stride)) if n != 1]
    if not kept or kept[-1][1] != 1:
        kept.append((1, 1))
    dims, strides = [n for n, _ in kept], [st for _, st in kept]
    return address, address + span_elements(dims, strides) * size, dims, strides, size


def _shared(na: _Normal, nb: _Normal, marking: Marking | None) -> bool | None:
    """``elements_shared`` of two non-empty layouts made ``_normal``."""
    spans = (na, nb)
    (lo_a, hi_a, *_), (lo_b, hi_b, *_) = spans
    if hi_a <= lo_b or hi_b <= lo_a:
        return False
    # strides are never negative: a tensor's first element lies at its address
    if lo_a == lo_b or all(_dense(dims, st) for _, _, dims, st, _ in spans):
        return True
    if marking is not None and not marking.take_pair():
        return None
    (start_a, _, dims_a, st_a, size_a), (start_b, _, dims_b, st_b, size_b) = spans
    if (dims_a, st_a, size_a) == (dims_b, st_b, size_b) and _nested(dims_a, st_a):
        return _reaches(start_b - start_a, dims_a, st_a, size_a)
    lo, hi = min(lo_a, lo_b), max(hi_a, hi_b)
    rows = [math.prod(dims[:-1]) for _, _, dims, _, _ in spans]
    widths = [dims[-1] * size for _, _, dims, _, size in spans]
    if hi - lo > MASK_BYTES or max(rows) > MASK_ROWS:
        return None
    # charged what it writes and scans, and its mask: rows that overlap (a stride of 0) write
    # more than their span (a review of ours, session 50: seconds for a pair charged little)
    written = sum(r * w for r, w in zip(rows, widths))
    if marking is not None and not marking.take(sum(rows), max(hi - lo, written)):
        return None
    mask = bytearray(hi - lo)
    for at in _row_starts(start_a - lo, dims_a, st_a, size_a):
        mask[at : at + widths[0]] = b"\x01" * widths[0]
    return any(mask.find(1, at, at + widths[1]) != -1 for at in _row_starts(start_b - lo, dims_b, st_b, size_b))


def _dense(dims: list[int], strides: list[int]) -> bool:
    """Whether a layout's elements fill its span, each byte once: as many elements as the span
    holds is not enough (a stride of 0 repeats elements and leaves gaps: ``[2, 2]`` by
    ``[0, 3]`` spans four elements and holds two; a review of ours, session 50)."""
    return span_elements(dims, strides) == math.prod(dims) and _nested(dims, strides)


def _nested(dims: list[int], strides: list[int]) -> bool:
    """Whether each stride, largest first, passes everything the smaller ones reach: no two
    elements of the layout overlap, and an offset is reached by at most two steps on each
    dimension (``_reaches``)."""
    reach = 0
    for n, st in sorted(zip(dims, strides), key=lambda d: d[1]):
        if n > 1 and st <= reach:
            return False
        reach += (n - 1) * st
    return True


def _reaches(gap: int, dims: list[int], strides: list[int], size: int) -> bool:
    """Whether two tensors of one nested layout (``_nested``), the second ``gap`` bytes after
    the first, have a byte of an element in common: whether some difference of two indices,
    less than each dimension's size either way, steps a whole number of elements within one
    element of ``gap``."""
    order = sorted((d for d in zip(strides, dims) if d[1] > 1), reverse=True)

    def steps(left: int, i: int) -> bool:
        if i == len(order):
            return left == 0
        st, n = order[i]
        # nested: what the smaller strides reach is less than this one, so only the two
        # nearest multiples of it can leave a remainder they reach
        q = left // st
        return any(-n < k < n and steps(left - k * st, i + 1) for k in (q, q + 1))

    whole, part = divmod(gap, size)
    return steps(whole, 0) or (part != 0 and steps(whole + 1, 0))


def overwritten(output: str, earlier: str) -> str:
    """The reason given for memory returned again, by the correctness gate and the windows
    alike: ``output`` names the later call's output, ``earlier`` the call it was returned for."""
    return (
        f"output {output} is memory the kernel returned for {earlier}, overwritten: a caller that "
        "kept the earlier answer loses it. Return new tensors from every call (or declare "
        "destination passing)"
    )


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
    normal: _Normal
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
    slice of one buffer interleaves, and a layout past what can be marked may do so too). What
    is decided whatever the marking: one first address, and two outputs of one layout (a kept
    buffer, or a ring of them, handed out again some elements further along, strided or not:
    a review of ours, session 50). Left undecided, and so not named here: outputs of
    different layouts past what can be marked, and pairs past what a search looks at
    (``SEARCH_PAIRS``, which some 180 calls of one arena, their spans all overlapping, spend). A
    kernel that reuses memory there loses an earlier call's answer before the windows read it
    (REWARD_HACK, "behaves differently while timed") unless it reuses only what was read
    (a ring of old enough slots): on a CPU, where it saves the allocation of its outputs.

    The spans swept in order, each looked at against the earlier ones that reach it (alone
    those can share an element): dense against dense decided at once, strided pairs as
    ``elements_shared`` can (``Marking``: on a 2-core machine a search of 4096 calls of one
    arena took 0.3 s, its pairs spent). Once its pairs are spent, strided outputs are looked at by their first element
    alone."""
    placed = []
    for call, layouts in calls:
        for j, layout in enumerate(layouts):
            if layout is None or layout[0] <= 0 or math.prod(layout[1]) == 0 or (normal := _normal(layout)) is None:
                continue
            start, end, dims, strides, _ = normal
            placed.append(_Placed(start, end, call, j, normal, _dense(dims, strides)))
    placed.sort()
    if marking is None:
        marking = Marking()
    # (end, order, output): the outputs looked at whose spans may reach the next one
    active: list[tuple[int, int, _Placed]] = []
    here: _Placed | None = None  # the first output whose span starts where the current one's does
    spent = False  # the pairs, and the strided outputs left out of ``active`` since
    for order, p in enumerate(placed):
        if here is None or here.start != p.start:
            here = p
        elif here.call != p.call:
            return _named(here, p)
        while active and active[0][0] <= p.start:
            heapq.heappop(active)
        for _, _, q in active:
            if q.call != p.call and _shared(q.normal, p.normal, marking):
                return _named(q, p)
        if p.dense or marking.left:
            heapq.heappush(active, (p.end, order, p))
        if not marking.left and not spent:
            spent = True
            active = [entry for entry in active if entry[2].dense]
            heapq.heapify(active)
    return None


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
