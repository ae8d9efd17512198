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


def test_uniform_byte_reads_every_chunk():
    from guard.runner.poison import uniform_byte

    x = torch.zeros(8, dtype=torch.uint8)
    assert uniform_byte(x, chunk_bytes=4) == 0
    x[4:] = 7  # each chunk uniform, the two not the same
    assert uniform_byte(x, chunk_bytes=4) is None
    x[:4] = 7
    assert uniform_byte(x, chunk_bytes=3) == 7
    assert uniform_byte(torch.zeros(0)) is None and uniform_byte(torch.ones(4, 4).t()) is None


def _marked(outs):
    """The guard's side of the first call: outputs recorded and marked, then the guard's own
    references dropped (``outs`` is emptied): what still holds them is the caller's."""
    from guard.runner import repeat_mark

    first = repeat_mark.first_outputs(outs, device_type="cpu")
    repeat_mark.mark_in_place(outs, device_type="cpu")
    outs.clear()
    return first


def test_a_kept_result_or_a_copy_of_it_is_told_from_a_computed_one():
    """The repeat check on a GPU marks the first call's outputs and lets go of them; a second
    call that returns that very buffer, which it kept, or a copy of it made after the mark (a
    C++ cache that clones its entry: INCORRECT_NUMERICAL on the H100 in session 37, read as
    non-determinism) returned a kept result. One that computed, or whose new buffer was left
    unwritten (it reads as the poison of free blocks, not the mark), did not. Tensors on the CPU
    stand for the device's: what is read is the same."""
    from guard.runner import repeat_mark
    from guard.runner.poison import POISON_BYTE

    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
        cache = [torch.randn(3, 8).mul(10).to(dtype)]  # the cache keeps what it returned
        first = _marked(list(cache))
        try:
            kept = cache[0]
            assert first[0] is not None and first[0].watched, dtype
            assert repeat_mark.reads_as_mark(kept), dtype
            why = repeat_mark.kept_from_first_call(["y"], [kept], first)
            assert why is not None and "'y'" in why and "first call's output" in why, dtype
            why = repeat_mark.kept_from_first_call(["y"], [kept.clone()], first)
            assert why is not None and "copy" in why, dtype
            unwritten = torch.empty_like(kept)
            unwritten.view(torch.uint8).fill_(POISON_BYTE)  # a fresh block, as ``poison_free_blocks`` left it
            assert repeat_mark.kept_from_first_call(["y"], [unwritten], first) is None, dtype
            assert repeat_mark.kept_from_first_call(["y"], [torch.randn(3, 8).to(dtype)], first) is None, dtype
        finally:
            repeat_mark.release(first)
        assert first == []  # released once


def test_a_kernel_that_accumulates_into_a_buffer_it_keeps_is_not_called_a_cache():
    """A bug, not a cache: the output buffer kept from call to call and summed into without
    zeroing it. Its second output is the mark plus the answer: with a mark of large magnitude
    (0xFE bytes, -1.7e38 in float32) the sums stayed the mark exactly and read as a kept
    result; the mark is now a tiny number, so they are the answer and the comparison of the two
    calls judges them."""
    from guard.runner import repeat_mark

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        answer = torch.randn(4, 16).to(dtype)
        kept = [answer.clone()]  # the first call's output: its buffer, kept
        first = _marked(list(kept))
        try:
            kept[0] += answer  # the second call adds into it again
            assert not repeat_mark.reads_as_mark(kept[0]), dtype
            assert repeat_mark.kept_from_first_call(["y"], kept, first) is None, dtype
        finally:
            repeat_mark.release(first)


def test_memory_the_first_call_let_go_of_is_never_taken_for_a_kept_result():
    """A first output that nothing references after the second call was freed: the second call
    may be handed its block, mark and all (a destination buffer, a block reused at the same
    address) and leave it unwritten, a bug and not a cache. A bool output: the guard poisons a
    destination buffer True, the bool mark, so only the kept storage itself counts for it."""
    from guard.runner import repeat_mark

    first = _marked([torch.randn(3, 8)])  # the guard's list held its only reference
    try:
        reused = torch.empty(3, 8)
        reused.view(torch.uint8).fill_(repeat_mark.MARK_BYTE)  # the freed block, handed out again
        assert repeat_mark.reads_as_mark(reused)
        assert repeat_mark.kept_from_first_call(["y"], [reused], first) is None
    finally:
        repeat_mark.release(first)

    cache = [torch.randn(16) > 0]
    first = _marked(list(cache))
    try:
        assert first[0] is not None and first[0].watched and first[0].is_bool
        fresh = torch.ones(16, dtype=torch.bool)  # a destination buffer as the guard poisons it
        assert repeat_mark.kept_from_first_call(["m"], [fresh], first) is None
        assert "first call's output" in (repeat_mark.kept_from_first_call(["m"], cache, first) or "")
        assert repeat_mark.kept_from_first_call(["m"], cache, [None]) is None  # nothing marked (a CPU)
    finally:
        repeat_mark.release(first)


def test_answers_all_of_one_value_are_not_watched_and_views_of_other_bytes_not_marked():
    """An honest mask that is all True holds the mark's bytes, an index all -1 the poison's (an
    output left unwritten reads so too), an answer all zeros nothing a kept buffer left alone
    could not hold: such outputs are not watched, and the comparison of the two calls judges
    them (a red team's honest ``isfinite`` was REWARD_HACK), while any other answer is still
    watched. A conjugate view, whose bytes are not its values, is neither marked nor watched."""
    from guard.runner import repeat_mark

    conj_values = torch.randn(4, dtype=torch.complex64)
    cache = [
        torch.ones(16, dtype=torch.bool),
        torch.full((4, 4), -1, dtype=torch.int64),
        torch.zeros(8),
        torch.randn(4, 4),
        conj_values.conj(),
    ]
    before = cache[4].resolve_conj().clone()
    first = _marked(list(cache))
    try:
        assert [f.watched for f in first if f is not None] == [False, False, False, True, False]
        names = ["mask", "index", "zeros", "values", "conj"]
        assert repeat_mark.kept_from_first_call(names[:3], cache[:3], first[:3]) is None
        assert "'values'" in (repeat_mark.kept_from_first_call(names, cache, first) or "")
        assert torch.equal(cache[4].resolve_conj(), before)  # left as it was
    finally:
        repeat_mark.release(first)
