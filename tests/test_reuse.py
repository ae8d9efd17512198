"""``guard.runner.reuse``: two outputs share memory by their elements, not by their storages
(a red team of ours, session 49: two column blocks of one buffer, as a fused projection returns
them, were "outputs that share memory", REWARD_HACK), and memory returned again is an element
of an earlier call's outputs, strided ones included (the same red team: a kept strided buffer
was named by neither check, and REWARD_HACK in the windows)."""

from __future__ import annotations

import itertools
import random

import pytest

torch = pytest.importorskip("torch")

from guard.runner.reuse import Marking, elements_shared, first_reuse, share_elements  # noqa: E402


def layout(t):
    return t.data_ptr(), list(t.shape), list(t.stride()), t.element_size()


def test_column_blocks_of_one_buffer_share_nothing_and_overlapping_ones_do():
    buf = torch.empty(16, 96)
    q, k, v = buf[:, :32], buf[:, 32:64], buf[:, 64:]
    assert not share_elements(layout(q), layout(k))
    assert not share_elements(layout(q), layout(v))
    assert share_elements(layout(buf[:, 16:48]), layout(k))  # columns 32-47 in both
    assert share_elements(layout(buf[3:5]), layout(q))  # rows of the buffer hold q's elements


def test_dense_and_empty_and_unmarkable_layouts():
    buf = torch.empty(1024)
    assert not share_elements(layout(buf[:512]), layout(buf[512:]))
    assert share_elements(layout(buf[:513]), layout(buf[512:]))
    assert not share_elements(layout(buf[:0]), layout(buf))
    every_other = buf[::2]  # a last dimension that is not contiguous: marked element by element
    assert not share_elements(layout(every_other), layout(buf[1::2]))
    assert share_elements(layout(every_other), layout(buf[2::2]))
    # past what can be marked (a joint span over MASK_BYTES), two layouts count as shared
    far = 20 << 20
    a, b = (0x10000, [4, 16], [far, 1], 4), (0x10000 + 64 * 4, [4, 8], [far, 2], 4)
    assert elements_shared(a, b) is None and share_elements(a, b)


def test_a_kept_strided_buffer_is_memory_returned_again():
    """Every call computing into a column slice of one wide buffer it keeps overwrites the
    earlier call's answer; so does one whose slice moves along the buffer onto earlier columns.
    Named whatever the strides: a transposed column slice, and red team 49's ``buf[:, ::2]``,
    whose rows are not contiguous (one address decides it). The output named is the later
    call's."""
    wide, other = torch.empty(16, 96), torch.empty(16, 32)
    kept = wide[:, :32]
    assert first_reuse([(0, [layout(kept)]), (1, [layout(other)]), (2, [layout(kept)])]) == (0, 2, 0)
    assert first_reuse([(0, [layout(wide[:, :32])]), (1, [layout(wide[:, 16:48])])]) == (0, 1, 0)
    for view in (wide[:, 32:64].t(), wide[:, ::2]):
        assert first_reuse([(0, [layout(view)]), (1, [layout(view)])]) == (0, 1, 0)
    small, smaller = torch.empty(3), torch.empty(3)
    assert first_reuse([(0, [layout(small), layout(kept)]), (1, [layout(smaller), layout(wide[:, 8:40])])]) == (0, 1, 1)


def test_column_slices_of_one_arena_are_not_memory_returned_again():
    """An arena that hands every call the next column block of one buffer: the blocks' spans
    all meet, their elements do not, and nothing is overwritten. A call handed columns an
    earlier call was handed is named."""
    arena = torch.empty(8, 16 * 64)
    calls = [(i, [layout(arena[:, 64 * i : 64 * (i + 1)])]) for i in range(16)]
    assert first_reuse(calls) is None
    calls.append((16, [layout(arena[:, 64 * 3 + 10 : 64 * 4 + 10])]))
    assert first_reuse(calls) == (3, 16, 0)


def test_what_cannot_be_marked_is_not_memory_returned_again():
    """Undecided (past what can be marked, or past the pairs a search may look at) is not
    reused: a false "reused" would say an honest kernel overwrote its answers. Two outputs of
    one call so laid out count as sharing (``share_elements``). Two outputs of one layout are
    decided from the distance between them, whatever the marking; one address decides any
    two; dense outputs need neither."""
    buf = torch.empty(1024)
    even, odd, later = buf[::2], buf[1::2], buf[2::2]
    assert elements_shared(layout(even), layout(odd)) is False
    assert first_reuse([(0, [layout(even)]), (1, [layout(odd)])]) is None
    assert first_reuse([(0, [layout(even)]), (1, [layout(later)])]) == (0, 1, 0)  # one element pair along
    far = 20 << 20
    a, b = (0x10000, [4, 16], [far, 1], 4), (0x10000 + 8 * 4, [4, 8], [far, 1], 4)  # b within a's rows
    assert elements_shared(a, b) is None
    assert first_reuse([(0, [a]), (1, [b])]) is None  # shared, but not told
    wide = torch.empty(16, 96)
    moved = [(0, [layout(wide[:, :32])]), (1, [layout(wide[:, 16:48])])]  # one layout, 16 columns along
    assert first_reuse(moved, Marking(rows=0)) == (0, 1, 0)
    assert first_reuse(moved, Marking(pairs=0)) is None  # no pair left to look at
    narrower = [(0, [layout(wide[:, :32])]), (1, [layout(wide[:, 16:40])])]  # two layouts: marked
    assert first_reuse(narrower) == (0, 1, 0)
    assert first_reuse(narrower, Marking(rows=8)) is None
    kept = [(0, [layout(wide[:, 16:48])]), (1, [layout(wide[:, 16:48])])]
    assert first_reuse(kept, Marking(rows=0, pairs=0)) == (0, 1, 0)
    dense = [(0, [layout(buf[:512])]), (1, [layout(buf[256:768])])]
    assert first_reuse(dense, Marking(rows=0, pairs=0)) == (0, 1, 0)


# a review of ours, session 50: layouts that the first element-wise search left undecided,
# and so did not name, though they reuse memory


def _ring(calls: int, slots: int, rows: int, cols: int, size: int = 2) -> list:
    """One kept buffer whose slot ``i % slots`` call ``i`` gets, every other element of
    ``[rows, 2 * cols]``, two elements further along each time the ring comes round: each call
    past the first round overwrites most of an earlier call's elements at another address."""
    base, slot = 0x7F0000000000, 2 * cols + 1024
    row = slot * slots
    return [
        (i, [(base + size * ((i % slots) * slot + 2 * ((i // slots) % 512)), [rows, cols], [row, 2], size)])
        for i in range(calls)
    ]


def test_a_ring_of_one_kept_strided_buffer_is_named():
    calls = _ring(calls=64, slots=16, rows=8, cols=4096)
    assert first_reuse(calls) == (0, 16, 0)
    # a slot one element along would interleave, sharing nothing: not named
    ((_, [(address, shape, stride, size)]),) = calls[:1]
    assert first_reuse([(0, [(address, shape, stride, size)]), (1, [(address + size, shape, stride, size)])]) is None


def test_one_layout_past_the_mask_is_decided_from_the_distance():
    """Rows padded so that two outputs' joint span passes MASK_BYTES (untouched pages cost no
    memory): two of one layout are decided from the distance between them all the same."""
    base, rows, cols, size, row = 0x7F0000000000, 4, 4096, 2, 12 << 20
    kept = [(i, [(base + size * (i % 4) * (cols + 64), [rows, cols], [row, 1], size)]) for i in range(4)]
    assert first_reuse(kept) is None  # four slots side by side in each row
    shifted = kept + [(4, [(base + size * 7, [rows, cols], [row, 1], size)])]  # slot 0 again, 7 along
    assert first_reuse(shifted) == (0, 4, 0)
    beside = kept + [(4, [(base + size * (4 * (cols + 64)), [rows, cols], [row, 1], size)])]  # a fifth slot
    assert first_reuse(beside) is None


def test_large_pairs_marked_first_leave_the_rest_looked_at():
    """Six calls' blocks of a wide, mostly untouched buffer at low addresses spend the marking
    (48 MiB a pair); a kept buffer handed out a column further every call, higher up, is
    still named."""
    size, low, high, burn_row = 4, 0x100000000, 0x200000000, (16 << 20) // 4
    burn = [(i, [(low + size * 64 * i, [4, 64], [burn_row, 1], size)]) for i in range(6)]
    kept = [(6 + i, [(high + size * i, [4, 64], [256, 1], size)]) for i in range(10)]
    assert first_reuse(burn) is None
    assert first_reuse(burn + kept) == (6, 7, 0)


def test_a_zero_dim_output_beside_a_strided_one_is_compared():
    """A 0-d output has no last stride: it raised IndexError out of the guard's windows (no
    verdict), and out of the gate for an honest kernel."""
    block = (0x20000, [4, 8], [32, 1], 4)  # a quarter of the columns of a [4, 32] buffer
    assert elements_shared(block, (0x20000 + 4 * 10, [], [], 4)) is False  # column 10: a gap
    assert elements_shared(block, (0x20000 + 4 * 33, [], [], 4)) is True  # row 1, column 1
    assert share_elements(block, (0x20000 + 4 * 10, [], [], 4)) is False


def test_overlapping_rows_are_charged_what_they_write():
    """Rows described over each other (a stride of 0) write their width once per row into a
    span of one: charged for it, a search of such pairs ends at once instead of taking seconds
    of the guard's thread."""
    size, last, r2, k = 4, 32768, 1024, 12
    g = k * last + 64
    calls = [(i, [(0x100000000 + size * i * last, [2, r2, last], [g, 0, 1], size)]) for i in range(k)]
    marking = Marking()
    # the first pair alone writes 512 MiB, past what a search marks: undecided, nothing marked
    assert elements_shared(calls[0][1][0], calls[1][1][0], marking) is None
    assert marking.nbytes == 0 and marking.rows == 0
    assert first_reuse(calls) is None


def _bytes_of(layout: tuple) -> set[int]:
    address, shape, stride, size = layout
    return {
        address + size * sum(i * st for i, st in zip(index, stride)) + b
        for index in itertools.product(*map(range, shape))
        for b in range(size)
    }


def test_elements_shared_agrees_with_every_byte_counted():
    """Small layouts drawn at random (one layout at two addresses, or two layouts; strides
    nested or not, last dimensions contiguous or not), against their bytes counted one by
    one: where ``elements_shared`` decides, it is right."""
    rng = random.Random(50)
    decided = 0
    for _ in range(3000):
        size = rng.choice([1, 2, 4])
        dims = rng.randint(1, 3)
        shape = [rng.randint(1, 4) for _ in range(dims)]
        stride = [rng.randint(0, 12) for _ in range(dims)]
        a = (4096, shape, stride, size)
        if rng.random() < 0.5:
            b = (4096 + rng.randint(1, 64), shape, stride, size)
        else:
            other = [rng.randint(1, 4) for _ in range(dims)]
            b = (4096 + rng.randint(0, 64), other, [rng.randint(0, 12) for _ in range(dims)], size)
        got = elements_shared(a, b)
        if got is not None:
            decided += 1
            assert got == bool(_bytes_of(a) & _bytes_of(b)), (a, b)
    assert decided > 2500  # nearly all are decided at these sizes
