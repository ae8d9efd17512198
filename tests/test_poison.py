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


def test_a_swapped_function_body_is_a_violation():
    """A captured Python function keeps its identity when its ``__code__`` is swapped (from a
    C++ extension through Python's C API, out of the screen's sight): its body is compared."""
    import statistics

    from guard.runner import harness

    # what else this process changed before (another test's import of torch._dynamo) stays
    before = harness.violations()
    original = statistics.median.__code__
    try:
        statistics.median.__code__ = (lambda data: 0.0).__code__
        swapped = harness.violations()
    finally:
        statistics.median.__code__ = original
    assert [v for v in swapped if v not in before] == ["the body of statistics.median was replaced"]
    assert harness.violations() == before


def test_a_failure_of_the_workers_own_step_in_the_candidates_process_is_the_candidates(tmp_path, monkeypatch):
    """What fails around a checked call in the candidate's process (a snapshot, the poison) is
    a RUNTIME_ERROR of the candidate's, without text its code may have set, never INTERNAL."""
    import pytest

    from guard.runner import candidate_role
    from guard.runner.common import CandidateFault

    role = candidate_role.CandidateRole("cpu", tmp_path)
    role.d = {"inputs": {"x": {"shape": [3], "dtype": "float32"}}, "outputs": {"y": {"shape": [3], "dtype": "float32"}}}
    role.fn = lambda x: x * 2

    def broken(_ts, _call_bytes):
        raise MemoryError("held-out shape 4097 x 8191")

    monkeypatch.setattr(candidate_role, "snapshots", broken)
    with pytest.raises(CandidateFault) as fault:
        role._call([torch.ones(3)], {}, call_bytes=24)
    assert fault.value.status == "RUNTIME_ERROR"
    assert "MemoryError" in fault.value.message and "4097" not in fault.value.message


def test_a_kept_result_still_poisoned_is_told_from_a_rewritten_buffer():
    """The repeat check on a GPU poisons the first call's outputs; a second call that returns
    that very buffer untouched returned a kept result (a cache), one that wrote it again did not
    (an honest kernel with a static output buffer). Tensors on the CPU stand for the device's:
    what is read is the same."""
    from guard.runner.candidate_role import _kept_from_first_call
    from guard.runner.poison import poison_tensor, reads_as_poison

    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.bool):
        out = torch.zeros(5, 7, dtype=dtype)
        assert not reads_as_poison(out)
        poison_tensor(out)
        assert reads_as_poison(out) and reads_as_poison(out, chunk_bytes=3), dtype
        out.view(-1)[20] = 0  # one element written since
        assert not reads_as_poison(out) and not reads_as_poison(out, chunk_bytes=3), dtype
    assert not reads_as_poison(torch.ones(4, 4).t())  # not contiguous: not read

    kept = torch.randn(3, 8)
    at = [kept.data_ptr()]
    poison_tensor(kept)
    why = _kept_from_first_call(["y"], [kept], at)
    assert why is not None and "'y'" in why and "kept" in why
    rewritten = kept.normal_()  # the same buffer, computed again
    assert _kept_from_first_call(["y"], [rewritten], at) is None
    other = torch.full((3, 8), float("nan"))  # poison-like values, a buffer of its own
    poison_tensor(other)
    assert _kept_from_first_call(["y"], [other], at) is None
    assert _kept_from_first_call(["y"], [kept], [None]) is None  # nothing was poisoned there (a CPU)


def test_an_answer_that_reads_as_the_poison_is_never_taken_for_a_kept_one():
    """An honest mask that is all True, or an index all -1, holds the poison's bytes; with
    destination passing the caching allocator hands the second call the first call's block.
    Such an output is left to the comparison of the two calls (a red team's honest
    ``isfinite`` was REWARD_HACK), while any other answer is still watched."""
    from guard.runner.candidate_role import _kept_from_first_call, _poisoned_addresses
    from guard.runner.poison import poison_tensor

    mask = torch.ones(16, dtype=torch.bool)
    index = torch.full((4, 4), -1, dtype=torch.int64)
    values = torch.randn(4, 4)
    at = _poisoned_addresses([mask, index, values], device_type="cpu")
    assert at[:2] == [None, None] and at[2] == values.data_ptr()
    for t in (mask, index, values):
        poison_tensor(t)
    assert _kept_from_first_call(["mask", "index"], [mask, index], at[:2]) is None
    assert "'values'" in (_kept_from_first_call(["mask", "index", "values"], [mask, index, values], at) or "")
