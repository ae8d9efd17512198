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


def test_reads_as_poison_reads_every_chunk():
    from guard.runner.poison import poison_tensor, reads_as_poison

    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.bool):
        out = torch.zeros(5, 7, dtype=dtype)
        assert not reads_as_poison(out)
        poison_tensor(out)
        assert reads_as_poison(out) and reads_as_poison(out, chunk_bytes=3), dtype
        out.view(-1)[20] = 0  # one element written since
        assert not reads_as_poison(out) and not reads_as_poison(out, chunk_bytes=3), dtype
    assert not reads_as_poison(torch.ones(4, 4).t())  # not contiguous: not read


def test_a_kept_result_or_a_copy_of_it_is_told_from_a_computed_one():
    """The repeat check on a GPU marks the first call's outputs; a second call that returns
    that very buffer untouched, or a copy of it made after the mark (a C++ cache that clones
    its entry: INCORRECT_NUMERICAL on the H100 in session 37, as non-determinism), returned a
    kept result; one that wrote the buffer again (an honest kernel with a static output
    buffer) or a buffer of its own did not, and neither did one whose new buffer was left
    unwritten (it reads as the poison of free blocks, not the mark). Tensors on the CPU stand
    for the device's: what is read is the same."""
    from guard.runner import repeat_mark
    from guard.runner.poison import POISON_BYTE

    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        first = (torch.randn(3, 8) > 0) if dtype == torch.bool else torch.randn(3, 8).to(dtype)
        kept = first  # what a cache holds: the tensor it returned
        marked = repeat_mark.first_outputs([first], device_type="cpu")
        assert marked[0] is not None and marked[0][1], dtype
        repeat_mark.mark_in_place([first], device_type="cpu")
        assert repeat_mark.reads_as_mark(first), dtype
        why = repeat_mark.kept_from_first_call(["y"], [kept], marked)
        assert why is not None and "'y'" in why and "kept" in why, dtype
        copy = kept.clone()  # another buffer, the mark and all
        why = repeat_mark.kept_from_first_call(["y"], [copy], marked)
        assert why is not None and "copy" in why, dtype
        unwritten = torch.empty_like(kept)
        unwritten.view(torch.uint8).fill_(POISON_BYTE)  # a fresh block, as ``poison_free_blocks`` left it
        assert repeat_mark.kept_from_first_call(["y"], [unwritten], marked) is None, dtype
        computed = kept.clone().zero_() if dtype != torch.bool else kept.clone().fill_(False)
        assert repeat_mark.kept_from_first_call(["y"], [computed], marked) is None, dtype
    rewritten = torch.randn(3, 8)
    marked = repeat_mark.first_outputs([rewritten], device_type="cpu")
    repeat_mark.mark_in_place([rewritten], device_type="cpu")
    rewritten.normal_()  # the same buffer, computed again
    assert repeat_mark.kept_from_first_call(["y"], [rewritten], marked) is None
    assert repeat_mark.kept_from_first_call(["y"], [rewritten], [None]) is None  # nothing marked (a CPU)


def test_an_answer_that_reads_as_the_mark_or_the_poison_is_never_taken_for_a_kept_one():
    """An honest mask that is all True holds the mark's bytes, an index all -1 the poison's
    (an output left unwritten reads so too: its freed block may come back to the second call
    unwritten); with destination passing the caching allocator hands the second call the first
    call's block. Such outputs are left to the comparison of the two calls (a red team's honest
    ``isfinite`` was REWARD_HACK), while any other answer is still watched."""
    from guard.runner import repeat_mark

    mask = torch.ones(16, dtype=torch.bool)
    index = torch.full((4, 4), -1, dtype=torch.int64)
    values = torch.randn(4, 4)
    marked = repeat_mark.first_outputs([mask, index, values], device_type="cpu")
    assert [m[1] for m in marked if m is not None] == [False, False, True]
    repeat_mark.mark_in_place([mask, index, values], device_type="cpu")
    assert repeat_mark.kept_from_first_call(["mask", "index"], [mask, index], marked[:2]) is None
    why = repeat_mark.kept_from_first_call(["mask", "index", "values"], [mask, index, values], marked)
    assert "'values'" in (why or "")
