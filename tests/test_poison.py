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


def _first_call(outs, cache):
    """The guard's side of the first call: outputs recorded and marked, the guard's own
    references dropped (``outs`` is emptied), whatever ``cache`` holds still held."""
    from guard.runner import repeat_mark

    first = repeat_mark.first_outputs(outs, device_type="cpu")
    repeat_mark.mark_in_place(outs, device_type="cpu")
    outs.clear()
    return first, repeat_mark.still_held(first), cache


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
        answer = torch.randn(3, 8).mul(10).to(dtype)
        first, held, cache = _first_call([answer], [answer])  # the cache keeps what it returned
        del answer
        kept = cache[0]
        assert first[0] is not None and first[0].watched and held == [True], dtype
        assert repeat_mark.reads_as_mark(kept), dtype
        why = repeat_mark.kept_from_first_call(["y"], [kept], first, held)
        assert why is not None and "'y'" in why and "first call's output" in why, dtype
        why = repeat_mark.kept_from_first_call(["y"], [kept.clone()], first, held)
        assert why is not None and "copy" in why, dtype
        unwritten = torch.empty_like(kept)
        unwritten.view(torch.uint8).fill_(POISON_BYTE)  # a fresh block, as ``poison_free_blocks`` left it
        assert repeat_mark.kept_from_first_call(["y"], [unwritten], first, held) is None, dtype
        assert repeat_mark.kept_from_first_call(["y"], [kept.clone().zero_()], first, held) is None, dtype


def test_memory_the_first_call_let_go_of_is_never_taken_for_a_kept_result():
    """A first output that nothing references once the guard let go of it was freed: a second
    call may be handed its block, mark and all (a destination buffer, a block reused at the same
    address) and leave it unwritten, a bug and not a cache. Likewise a bool output: the guard
    poisons a destination buffer True, the bool mark, so only the kept buffer itself counts."""
    from guard.runner import repeat_mark

    first, held, _ = _first_call([torch.randn(3, 8)], [])  # the guard's list held its only reference
    assert held == [False]
    reused = torch.empty(3, 8)
    reused.view(torch.uint8).fill_(repeat_mark.MARK_BYTE)  # the freed block, handed out again
    assert repeat_mark.reads_as_mark(reused)
    assert repeat_mark.kept_from_first_call(["y"], [reused], first, held) is None

    mask = torch.randn(16) > 0
    first, held, cache = _first_call([mask], [mask])
    del mask
    assert first[0] is not None and first[0].watched and first[0].is_bool and held == [True]
    fresh = torch.ones(16, dtype=torch.bool)  # a destination buffer as the guard poisons it
    assert repeat_mark.kept_from_first_call(["m"], [fresh], first, held) is None
    assert "first call's output" in (repeat_mark.kept_from_first_call(["m"], [cache[0]], first, held) or "")
    assert repeat_mark.kept_from_first_call(["m"], [cache[0]], [None], [False]) is None  # nothing marked (a CPU)


def test_an_answer_that_reads_as_the_mark_or_the_poison_is_never_taken_for_a_kept_one():
    """An honest mask that is all True holds the mark's bytes, an index all -1 the poison's (an
    output left unwritten reads so too), an int8 output all -2 the mark's: such outputs are not
    watched, and the comparison of the two calls judges them (a red team's honest ``isfinite``
    was REWARD_HACK), while any other answer is still watched. A conjugate view, whose bytes are
    not its values, is neither marked nor watched."""
    from guard.runner import repeat_mark

    mask = torch.ones(16, dtype=torch.bool)
    index = torch.full((4, 4), -1, dtype=torch.int64)
    minus_two = torch.full((8,), -2, dtype=torch.int8)
    values = torch.randn(4, 4)
    conj = torch.randn(4, dtype=torch.complex64).conj()
    outs = [mask, index, minus_two, values, conj]
    first, held, cache = _first_call(outs, list(outs))
    assert [f.watched for f in first if f is not None] == [False, False, False, True, False]
    assert held == [True] * 5
    names = ["mask", "index", "minus_two", "values", "conj"]
    assert repeat_mark.kept_from_first_call(names[:3], cache[:3], first[:3], held[:3]) is None
    assert "'values'" in (repeat_mark.kept_from_first_call(names, cache, first, held) or "")
    assert not repeat_mark.reads_as_mark(cache[4])  # left as it was, not marked
