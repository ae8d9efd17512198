"""``guard.runner.reuse``: two outputs share memory by their elements, not by their storages
(a red team of ours, session 49: two column blocks of one buffer, as a fused projection returns
them, were "outputs that share memory", REWARD_HACK), and memory returned again is an element
of an earlier call's outputs, strided ones included (the same red team: a kept strided buffer
was named by neither check, and REWARD_HACK in the windows)."""

from __future__ import annotations

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
    every_other = buf[::2]  # a last dimension that is not contiguous: not marked, counted as shared
    assert share_elements(layout(every_other), layout(buf[1::2]))


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
    """Undecided (rows not contiguous, or past what a search may mark) is not reused: a false
    "reused" would say an honest kernel overwrote its answers, and one that did is still caught
    by the windows' read, as before. Two outputs of one call so laid out count as sharing
    (``share_elements``). One address decides a layout that cannot be marked (a kept buffer),
    and dense outputs need no marking."""
    buf = torch.empty(1024)
    even, odd, later = buf[::2], buf[1::2], buf[2::2]
    assert elements_shared(layout(even), layout(odd)) is None and share_elements(layout(even), layout(odd))
    assert first_reuse([(0, [layout(even)]), (1, [layout(odd)])]) is None
    assert first_reuse([(0, [layout(even)]), (1, [layout(later)])]) is None  # shared, but not told
    assert first_reuse([(0, [layout(even)]), (1, [layout(even)])]) == (0, 1, 0)
    wide = torch.empty(16, 96)
    moved = [(0, [layout(wide[:, :32])]), (1, [layout(wide[:, 16:48])])]
    assert first_reuse(moved, Marking(rows=8)) is None
    assert first_reuse(moved, Marking(rows=0)) is None
    kept = [(0, [layout(wide[:, 16:48])]), (1, [layout(wide[:, 16:48])])]
    assert first_reuse(kept, Marking(rows=0)) == (0, 1, 0)
    dense = [(0, [layout(buf[:512])]), (1, [layout(buf[256:768])])]
    assert first_reuse(dense, Marking(rows=0)) == (0, 1, 0)
