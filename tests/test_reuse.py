"""``guard.runner.reuse.share_elements``: two outputs share memory by their elements, not by
their storages (a red team of ours, session 49: two column blocks of one buffer, as a fused
projection returns them, were "outputs that share memory", REWARD_HACK)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from guard.runner.reuse import share_elements  # noqa: E402


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
