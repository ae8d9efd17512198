"""The output poison's free blocks, read from the caching allocator's snapshot (the fill
itself needs a GPU: tests/gpu/test_gpu_trust.py)."""

from __future__ import annotations

import torch

from guard.runner.poison import free_ranges, poison_free_blocks


def test_free_ranges_follow_the_blocks_in_address_order():
    segments = [
        {
            "device": 0,
            "address": 1000,
            "blocks": [
                {"size": 100, "state": "active_allocated"},
                {"size": 50, "state": "inactive"},
                {"size": 30, "state": "active_pending_free"},
                {"size": 20, "state": "inactive"},
            ],
        },
        {"device": 1, "address": 5000, "blocks": [{"size": 10, "state": "inactive"}]},
        {"device": 0, "address": 9000, "blocks": [{"size": 64, "state": "inactive", "address": 9000}]},
    ]
    # a block pending its stream's work is not free; another device's blocks are not ours
    assert free_ranges(segments, 0) == [(1100, 50), (1180, 20), (9000, 64)]
    assert free_ranges(segments, 1) == [(5000, 10)]


def test_nothing_to_poison_on_the_cpu():
    assert poison_free_blocks(torch.device("cpu")) == 0
