"""Units of the run-time trust defences: fresh data per timed call (refills, scrambles,
digests and their bounds), the outside clock's judgement, the worker messages' validation,
and stopping a worker's process tree."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from guard import outside_clock  # noqa: E402
from guard.runner import confirm, replays  # noqa: E402
from guard.runner import messages as m  # noqa: E402
from guard.runner.freeze import frozen  # noqa: E402
from guard.runner.inputs import InputMaker  # noqa: E402
from guard.runner.proc_tree import descendants  # noqa: E402
from guard.runner.refill import Draw, Refiller, StreamRefill, redraw  # noqa: E402
from guard.runner.refill_kinds import stream_refill_possible  # noqa: E402

DEF = {
    "name": "scale",
    "reference": "def run(x, idx):\n    return x * 2\n",
    "inputs": {"x": {"shape": ["n", 64], "dtype": "bfloat16"}, "idx": {"shape": ["n"], "dtype": "int64"}},
    "outputs": {"y": {"shape": ["n", 64], "dtype": "bfloat16"}},
}


def _maker():
    return InputMaker(DEF, "cpu")


def test_refill_redraws_floats_and_integers_in_place():
    maker = _maker()
    live = maker.make({}, {"n": 32}, seed=1)
    x_ptr, idx_ptr = live[0].data_ptr(), live[1].data_ptr()
    before = [t.clone() for t in live]
    refill = Refiller(maker, {}, {"n": 32})
    refill(live, seed=7)
    assert live[0].data_ptr() == x_ptr and live[1].data_ptr() == idx_ptr  # in place: what a graph reads
    # integers too: a kernel that rewrote its integer input in place (keeping its outputs
    # right) would otherwise find its own work again on every later call of the set
    assert not torch.equal(live[0], before[0]) and not torch.equal(live[1], before[1])
    assert 0 <= int(live[1].min()) and int(live[1].max()) < 64  # "idx": a label below x's last axis
    again = maker.make({}, {"n": 32}, seed=1)
    refill(again, seed=7)  # the same seed gives the same data in any worker
    assert all(torch.equal(a, b) for a, b in zip(again, live))
    refill(again, seed=8)
    assert not torch.equal(again[0], live[0]) and not torch.equal(again[1], live[1])


PAGED = {
    "name": "gather_pages",
    "reference": "def run(x, kv_indptr, kv_indices):\n    return x[kv_indices.long()].sum(0)\n",
    "axes": {"num_pages": {"type": "var"}, "n_idx": {"type": "var"}, "n_ptr": {"type": "var"}},
    "inputs": {
        "x": {"shape": ["num_pages", 8], "dtype": "float32"},
        "kv_indptr": {"shape": ["n_ptr"], "dtype": "int32"},
        "kv_indices": {"shape": ["n_idx"], "dtype": "int32"},
    },
    "outputs": {"y": {"shape": [8], "dtype": "float32"}},
}


@pytest.mark.parametrize("stream", [False, True])
def test_refill_redraws_offsets_and_indices_by_their_conventions(stream):
    axes = {"num_pages": 5, "n_idx": 400, "n_ptr": 9}
    maker = InputMaker(PAGED, "cpu")
    live = maker.make({}, axes, seed=3)
    ptr, idx = live[1].clone(), live[2].clone()
    assert int(ptr[-1]) == 400  # the maker's convention the refill keeps
    refill = Refiller(maker, {}, axes)
    assert [(d.name, d.kind, d.bound) for d in refill.draws] == [
        ("x", "float", 0),
        ("kv_indptr", "offsets", 400),
        ("kv_indices", "int", 5),
    ]
    if stream:  # the outside clock's loop: one generator drawn on in order
        draws = StreamRefill(refill.draws, torch.device("cpu"))
        draws.seed(11)
        draws(live)
    else:
        refill(live, seed=7)
    # offsets: new, from 0 to the count of indices, never decreasing (what make() gives)
    assert not torch.equal(live[1], ptr)
    assert int(live[1][0]) == 0 and int(live[1][-1]) == 400 and bool((live[1].diff() >= 0).all())
    assert not torch.equal(live[2], idx)
    assert int(live[2].min()) >= 0 and int(live[2].max()) == 4  # every page, none beyond
    # the reference runs on them as on inputs the maker made
    assert torch.isfinite(torch.as_tensor(live[0][live[2].long()].sum(0))).all()


@pytest.mark.parametrize("n_idx", [10, 400])
def test_offsets_are_new_on_every_draw(n_idx):
    """Red team, session 22: offsets' steps drawn below 2 * count / (k - 1) + 1 were all zero
    once the offsets outnumbered the indices twice over (65 offsets into 10 indices), so every
    call got the same run; and the clamp to the count emptied trailing segments."""
    axes = {"num_pages": 5, "n_idx": n_idx, "n_ptr": 65}
    maker = InputMaker(PAGED, "cpu")
    refill = Refiller(maker, {}, axes)
    runs = set()
    for seed in range(40):
        live = maker.make({}, axes, seed=3)
        refill(live, seed=seed)
        ptr = live[1]
        assert int(ptr[0]) == 0 and int(ptr[-1]) == n_idx and bool((ptr.diff() >= 0).all()), ptr
        runs.add(tuple(ptr.tolist()))
    assert len(runs) == 40


def test_a_patched_refill_step_is_seen():
    """The refill runs outside the timed span: work hidden in a patched ``random_`` would be
    done there, so the methods it calls are taken before the candidate loads and watched."""
    from guard.runner import harness

    before = harness.violations()
    original = torch.Tensor.random_
    try:
        torch.Tensor.random_ = lambda self, *a, **k: original(self, *a, **k)
        swapped = harness.violations()
    finally:
        torch.Tensor.random_ = original
    assert [v for v in swapped if v not in before] == ["Tensor.random_ was replaced (monkey-patching)"]
    assert harness.violations() == before


INT_ONLY = {
    "name": "histogram",
    "reference": "def run(codes):\n    return codes.sum(-1)\n",
    "inputs": {"codes": {"shape": ["n", 64], "dtype": "int32"}},
    "outputs": {"y": {"shape": ["n"], "dtype": "int64"}},
}


def test_integer_only_inputs_are_remade_for_every_call():
    # Nothing to redraw in place: a loop that kept each set's values would let a cache keyed
    # by them hit on every timed call, with answers the digests find right.
    maker = InputMaker(INT_ONLY, "cpu")
    assert not stream_refill_possible(INT_ONLY, {})
    live = maker.make({}, {"n": 16}, seed=1)
    ptr, before = live[0].data_ptr(), live[0].clone()
    refill = Refiller(maker, {}, {"n": 16})
    assert refill.custom  # remade by the InputMaker, the seeded regime
    refill(live, seed=7)
    assert live[0].data_ptr() == ptr and not torch.equal(live[0], before)
    again = maker.make({}, {"n": 16}, seed=1)
    refill(again, seed=7)  # the trusted worker gets the same values from the same seed
    assert torch.equal(again[0], live[0])
    # a float input beside the integers: redrawn in place, the stream regime
    assert stream_refill_possible(DEF, {})


def _confirm_loop(sets, static=None, rows=8, mirror=None):
    from guard.runner.confirm import ConfirmLoop

    maker = _maker()
    return ConfirmLoop(
        "cpu",
        sets,
        Refiller(maker, {}, {"n": 4}),
        static,
        rows,
        lambda ms: None,
        mirror=mirror,
        projection_seed=PROJECTION_SEED,
    )


PROJECTION_SEED = 77


def test_confirm_loop_digests_each_call_on_its_own_draw():
    """The outside clock's loop: every iteration draws new inputs from the loop's seed, and
    the trusted worker gets the same inputs by replaying the draws (``inputs_at``)."""
    maker = _maker()
    sets = [maker.make({}, {"n": 4}, seed=s) for s in (1, 2)]
    static = [[torch.empty(4, 64, dtype=torch.bfloat16)] for _ in sets]
    loop = _confirm_loop(sets, static)
    table = loop.run(seed=11, iters=6, call=lambda k: [sets[k][0] * 2], pad_passes=0)
    assert len(table) == 6 and all(len(row) == 1 and len(row[0]) == replays.DIGEST_WIDTH for row in table)

    checker = _confirm_loop([maker.make({}, {"n": 4}, seed=s) for s in (1, 2)])
    projection = replays.Projection(PROJECTION_SEED)
    seen = []
    for it, args in checker.inputs_at(11, [0, 3, 5]):
        values, allow = replays.digest_bounds(args[0] * 2, 1e-2, 1e-2, projection, call=it)
        assert replays.digest_mismatch(table[it][0], values, allow, "y") is None
        seen.append(args[0].clone())
    assert not torch.equal(seen[0], seen[1])  # fresh inputs every call, sets 0 and 1 alike
    # a call that answered for the previous iteration's inputs fails the check
    stale = loop.run(seed=12, iters=4, call=lambda k: [sets[k][0] * 2] if k == 0 else None, pad_passes=0)
    for it, args in _confirm_loop([maker.make({}, {"n": 4}, seed=s) for s in (1, 2)]).inputs_at(12, [3]):
        values, allow = replays.digest_bounds(args[0] * 2, 1e-2, 1e-2, replays.Projection(PROJECTION_SEED), call=it)
        assert replays.digest_mismatch(stale[it][0], values, allow, "y") is not None


def test_confirm_loop_seeds_differ_and_rows_bound_the_loop():
    maker = _maker()
    sets = [maker.make({}, {"n": 4}, seed=1)]
    loop = _confirm_loop(sets, [[torch.empty(4, 64, dtype=torch.bfloat16)]], rows=4)
    a = loop.run(seed=1, iters=2, call=lambda k: [sets[k][0] * 2], pad_passes=0)
    b = loop.run(seed=2, iters=2, call=lambda k: [sets[k][0] * 2], pad_passes=0)
    assert a != b
    with pytest.raises(ValueError):
        loop.run(seed=1, iters=5, call=None, pad_passes=0)


def test_trusted_confirm_loop_copies_as_the_candidate_does():
    maker = _maker()
    sets = [maker.make({}, {"n": 4}, seed=1)]
    static = [[torch.zeros(4, 64, dtype=torch.bfloat16)]]
    mirror = [[torch.ones(4, 64, dtype=torch.bfloat16)]]
    loop = _confirm_loop(sets, static, mirror=mirror)
    table = loop.run(seed=3, iters=2, call=None, pad_passes=0)
    assert table[0][0][0] == 4 * 64  # the digest read the copied ones


def test_candidate_loop_copies_what_the_trusted_loop_is_charged():
    """The trusted loop copies an eager call's outputs when the candidate reported eager
    timing; a candidate loop whose call returns nothing (a captured graph, buffers written in
    place) copies as many bytes then, so reporting eager timing for a graph gains nothing."""
    maker = _maker()
    sets = [maker.make({}, {"n": 4}, seed=1)]
    static = [[torch.empty(4, 64, dtype=torch.bfloat16)]]

    def in_place(k):
        static[k][0].copy_(sets[k][0] * 2)

    loop = _confirm_loop(sets, static)
    loop.run(seed=3, iters=2, call=in_place, pad_passes=0)
    assert loop._spare_outputs is None  # not charged: nothing copied
    loop.run(seed=3, iters=2, call=in_place, pad_passes=0, copies=True)
    spare = loop._spare_outputs
    assert spare is not None and torch.equal(spare[0][0], static[0][0])  # the last call's outputs, copied


def test_scramble_leaves_no_fixed_poison():
    t = torch.zeros(1000, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    replays.scramble(t, gen)
    first = t.clone()
    replays.scramble((t,), gen)
    assert torch.isfinite(t).all() and not torch.equal(first, t)
    assert len(torch.unique(t.float())) > 100


def _digest_check(out: torch.Tensor, ref: torch.Tensor, atol=1e-2, rtol=1e-2, seed=5) -> str | None:
    p = replays.Projection(seed)
    got = replays.digest([out], p)[0].tolist()
    values, allow = replays.digest_bounds(ref, atol, rtol, p)
    return replays.digest_mismatch(got, values, allow, "y")


@pytest.mark.parametrize("n", [64, 4096, 1 << 20])
def test_digest_accepts_a_result_within_tolerance(n):
    gen = torch.Generator().manual_seed(n)
    ref = torch.randn(n, generator=gen)
    # an honest kernel: bf16 rounding, well inside the tolerance
    out = ref.to(torch.bfloat16)
    assert _digest_check(out, ref) is None
    # errors right at the element-wise limit, independent of the secret signs
    signs = torch.randint(0, 2, (n,), generator=gen) * 2 - 1
    edge = ref + signs * (1e-2 + 1e-2 * ref.abs()) * 0.999
    assert _digest_check(edge, ref) is None


@pytest.mark.parametrize("n", [4096, 1 << 20])
def test_digest_rejects_an_answer_for_other_inputs(n):
    """A remembered answer has the same norms as the right one, near enough: the projection
    on secret signs is what tells them apart, at every size."""
    gen = torch.Generator().manual_seed(n + 1)
    ref = torch.randn(n, generator=gen)
    stale = torch.randn(n, generator=gen)
    why = _digest_check(stale.to(torch.bfloat16), ref)
    assert why is not None and "output 'y'" in why


def test_sampled_elements_catch_an_approximation_whose_sums_pass():
    """A result 2% off everywhere (a timed call that skipped RMSNorm's reduction and guessed
    the scale: red team, session 27) keeps its sums, norms and projection within what a
    result within bf16's 1e-2 may have; the sampled elements, held to the tolerance itself,
    do not pass."""
    gen = torch.Generator().manual_seed(7)
    ref = torch.randn(1, 4096, generator=gen)
    p = replays.Projection(5)
    fields = len(replays.DIGEST_FIELDS)
    values, allow = replays.digest_bounds(ref, 1e-2, 1e-2, p, 0.99)
    got = replays.digest([ref * 1.02], p)[0].tolist()
    assert replays.digest_mismatch(got[:fields] + values[fields:], values, allow, "y", 0.99) is None
    why = replays.digest_mismatch(got, values, allow, "y", 0.99)
    assert why is not None and "sampled elements outside the tolerance" in why


def test_sampled_elements_let_through_what_the_ratio_allows():
    """As the correctness comparison: at required_matched_ratio 0.99 a few sampled elements
    may miss by rounding (at most ``misses_allowed``, none beyond 8x its allowance); at a
    ratio of 1 none may. The count allowed is the binomial tail's, exactly: a normal
    approximation's five deviations (5 of 64) accused a result at the ratio's limit once in
    22,000 checks (red team, session 27)."""
    assert replays.misses_allowed(64, 1.0) == 0 and replays.misses_allowed(64, 0.99) == 9
    assert replays.misses_allowed(1024, 0.99) == 34
    gen = torch.Generator().manual_seed(8)
    n = 1 << 14
    ref = torch.randn(n, generator=gen)
    p = replays.Projection(5)
    pos = p.positions(n, torch.device("cpu"))
    allowance = 1e-2 + 1e-2 * ref.abs()

    def check(off: torch.Tensor, by: float, ratio: float) -> str | None:
        out = ref.clone()
        out[off] += by * allowance[off]
        values, allow = replays.digest_bounds(ref, 1e-2, 1e-2, p, ratio)
        return replays.digest_mismatch(replays.digest([out], p)[0].tolist(), values, allow, "y", ratio)

    one = pos[:1]
    assert check(one, 3.0, 0.99) is None
    assert "1 of 64 sampled elements" in (check(one, 3.0, 1.0) or "")
    assert "one more than 8x its allowance" in (check(one, 20.0, 0.99) or "")
    assert check(torch.unique(pos)[:9], 3.0, 0.99) is None
    assert "10 of 64 sampled elements" in (check(torch.unique(pos)[:10], 3.0, 0.99) or "")


def test_misses_at_fixed_places_meet_new_samples_on_every_call(tmp_path):
    """Every call's sampled positions are drawn anew. An honest result whose few misses sit at
    fixed places within its ratio (here 3 of 1024 elements, 3x their allowance, where 0.99
    lets 10 miss), all three at call 0's samples, misses at call 0's samples only: while the
    positions were the same for every call, 16 calls made 48 misses of 1024 where 34 pass and
    it was REWARD_HACK, "timed call 0 did not compute the answer" (a loaded suite run,
    session 30). Counted over the calls, the samples still catch what no single call does: a
    result off at fixed places on 6% of its elements (about 4 of each call's 64, 9 may miss)
    misses about 61 of 1024. A result off everywhere fails at the first call."""
    from guard.problems.schema import Definition
    from guard.runner import trusted_role as tr

    from helpers import SCALE_DEF

    d = Definition.model_validate(SCALE_DEF)
    workload, axes, sets, run_seed = {"uuid": "w", "axes": {"n": 16}}, {"n": 16}, [5, 6], 7
    maker = InputMaker(d.to_json(), "cpu")
    refill = Refiller(maker, workload, axes)
    calls = list(range(16))
    projection = replays.Projection(run_seed, calls=len(calls))  # the timed loop's ("seeded"): the run's seed
    cpu = torch.device("cpu")
    unlucky = torch.unique(projection.positions(16 * 64, cpu, 0))[:3]
    every_17th = torch.arange(0, 16 * 64, 17)  # 61 of 1024 elements, 6%
    atol = rtol = 1e-3

    def digests(where: torch.Tensor | slice, off_by: float = 3.0) -> list:
        rows = []
        for it in calls:
            args = maker.make(workload, axes, sets[it % len(sets)], "normal")
            refill(args, replays.replay_seed(run_seed, it))
            y = (args[0] * 2).reshape(-1)
            y[where] += off_by * (atol + rtol * y[where].abs())
            rows.append(replays.digest([y.reshape(16, 64)], projection, it).tolist())
        return rows

    role = tr.TrustedRole("cpu", tmp_path)
    key = d.content_hash()
    assert role.handle({"op": "problem", "key": key, "definition": d.to_json(), "blob_root": None})["ok"]

    def verify(rows: list, chosen: list[int] = calls) -> dict:
        return role.handle(
            m.VerifyReplays(
                key=key,
                workload=workload,
                axes=axes,
                sets=sets,
                run_seed=run_seed,
                regime="seeded",
                iterations=chosen,
                digests=[rows[it] for it in chosen],
                tolerances=[m.Tolerance(atol=atol, rtol=rtol, required_matched_ratio=0.99)],
                names=["y"],
            ).model_dump()
        )

    honest = verify(digests(unlucky))
    assert honest["ok"] and honest["passed"], honest.get("message")
    off = digests(every_17th)
    # no call alone misses too often: only the count over the calls tells
    assert all(verify(off, [it])["passed"] for it in calls)
    approx = verify(off)
    assert approx["ok"] and approx["passed"] is False, approx
    assert "sampled elements over 16 calls outside the tolerance" in approx["message"], approx["message"]
    wrong = verify(digests(slice(None)))
    assert wrong["ok"] and wrong["passed"] is False and wrong["iteration"] == 0


def test_the_count_over_the_calls_holds_a_kernel_to_the_float64_reference_too():
    """As each call's check does, the count over the calls accuses only what the reference
    evaluated in float64 rejects too: a kernel more accurate than a reference that rounds its
    intermediates misses the rounded reference on 5% of the elements (about 3 of each call's 64
    samples, 9 may miss; about 51 of 1024 over 16 calls, 34 may), and none of the exact one."""
    from guard.runner import replay_check

    gen = torch.Generator().manual_seed(4)
    calls, n = 16, 4096
    p = replays.Projection(3, calls=calls)
    tol = [m.Tolerance(atol=1e-3, rtol=1e-3, required_matched_ratio=0.99)]
    tally = replay_check.SampleTally(1)
    seen = []
    for it in range(calls):
        hi = torch.randn(n, generator=gen, dtype=torch.float64)
        rounded = hi.clone()  # 3x the allowance off, on every 20th element, signs alternating
        off = 3 * (1e-3 + 1e-3 * hi[::20].abs())
        off[1::2] *= -1
        rounded[::20] += off
        out = hi.to(torch.float32)
        values, allow = replays.digest_bounds(rounded.to(torch.float32), 1e-3, 1e-3, p, 0.99, call=it)
        row = [replays.digest([out], p, it)[0].tolist()]
        assert replays.digest_mismatch(row[0], values, allow, "y", 0.99) is None  # each call alone passes
        tally.add(0, replays.compare_samples(row[0], values, allow).misses, it)
        seen.append((row, rounded.to(torch.float32), hi))
    assert tally.mismatch(tol, ["y"]) is not None  # held to the rounded reference alone: accused
    for it, (row, rounded, hi) in enumerate(seen):
        replay_check.lower_by_exact(tally, row, [rounded], [hi], tol, p, it)
    assert tally.mismatch(tol, ["y"]) is None


def test_digest_of_a_non_tensor_fails():
    p = replays.Projection(1)
    d = replays.digest([3.0], p)
    assert d.shape == (1, replays.DIGEST_WIDTH) and math.isnan(d[0, 0])
    values, allow = replays.digest_bounds(torch.ones(4), 0.0, 0.0, p)
    assert replays.digest_mismatch(d[0].tolist(), values, allow, "y")


def test_projection_is_the_same_in_every_worker():
    a, b = replays.Projection(11), replays.Projection(11)
    x = torch.randn(3 * replays.PROJECTION_PERIOD + 5)  # several chunks
    assert replays.digest([x], a).tolist() == replays.digest([x], b).tolist()
    assert replays.digest([x], replays.Projection(12))[0, 3] != replays.digest([x], a)[0, 3]
    exact = x.double()
    d = replays.digest([x], a)[0]
    assert abs(float(d[0]) - float(exact.sum())) < 1e-6 and abs(float(d[2]) - float(exact.norm())) < 1e-6


def test_projection_signs_are_fair_coin_flips_from_words_of_random_bits():
    """The signs come from words of random bits (session 47: one bit drawn at a time cost
    milliseconds, five times per timed workload): still +1 or -1 with equal chances, no bit
    position of a word favoured, and a projection's error bound (Hoeffding) holds as before."""
    projection = replays.Projection(21)
    signs = projection.weights(torch.device("cpu"))[1]
    n = projection.period
    assert signs.shape == (n,) and set(signs.unique().tolist()) == {-1.0, 1.0}
    assert abs(float(signs.mean())) < 6 / math.sqrt(n)
    # each of the 62 bit positions of the words, over the words: also balanced
    whole = n // replays.SIGN_WORD_BITS * replays.SIGN_WORD_BITS
    by_bit = signs[:whole].reshape(-1, replays.SIGN_WORD_BITS).mean(0)
    assert float(by_bit.abs().max()) < 6 / math.sqrt(whole // replays.SIGN_WORD_BITS)
    # neighbours uncorrelated, within a word and across words
    assert abs(float((signs[1:] * signs[:-1]).mean())) < 6 / math.sqrt(n)
    assert not torch.equal(signs, replays.Projection(22).weights(torch.device("cpu"))[1])


def test_the_projections_blind_swaps_are_as_secret_as_its_signs():
    """The signs repeat every period along a large output. With one period for every seed, a
    swap of elements a period apart changed no field of the digest, for any seed and without
    reading anything (red team, session 47): 98% of an output could be wrong with every field
    exact. The period is now drawn from the seed too. Swapping two whole periods at the old
    public distance leaves the sums and norms as they were (no permutation changes them) but
    moves the projection by about 2000 here (signs that differ on half the pairs), beyond what a
    result within bf16's tolerance may (213) for most seeds; the samples, not tested here, catch
    the rest. Only a swap at the seed's own period stays invisible, and finding it means reading
    the seed."""
    gen = torch.Generator().manual_seed(0)
    base = replays.PROJECTION_PERIOD
    y = torch.randn(3 * base + 12345, generator=gen, dtype=torch.float64)
    periods = {replays.Projection(seed).period for seed in range(1, 41)}
    assert len(periods) >= 35 and all(base <= p < base + replays.PERIOD_SPREAD for p in periods)
    caught = 0
    for seed in range(1, 21):
        projection = replays.Projection(seed)
        values, allow = replays.digest_bounds(y, 1e-2, 1e-2, projection)
        for distance, blind in ((base, False), (projection.period, True)):
            swapped = y.clone()
            swapped[:distance], swapped[distance : 2 * distance] = y[distance : 2 * distance], y[:distance]
            got = replays.digest([swapped], projection)[0].tolist()
            for k in range(3):  # sum, L1, L2
                assert abs(got[k] - values[k]) <= 1e-6 * abs(values[k]) + 1e-9
            moved = abs(got[3] - values[3])
            if blind:
                assert moved <= 1e-6 * abs(values[3]) + 1e-6
            else:
                caught += moved > allow[3]
    assert caught >= 16, f"the projection saw the swap at the old period for {caught} of 20 seeds"


def test_outside_clock_judges_a_slower_figure_and_a_short_loop():
    # 100 calls of 1 ms by the outside clock; the loop alone 5 ms a call
    honest = outside_clock.judge(0.6, 100, 0.5, 100, inside_ms=0.98, rel_band=0.1, abs_band_ms=0.004, loop_slack=0.0)
    assert honest.agrees and abs(honest.outside_ms - 1.0) < 1e-9
    forged = outside_clock.judge(0.6, 100, 0.5, 100, inside_ms=0.3, rel_band=0.1, abs_band_ms=0.004, loop_slack=0.0)
    assert not forged.agrees
    # the loop's own cost varies between windows: its slack widens the band
    assert outside_clock.judge(0.6, 100, 0.5, 100, 0.3, 0.1, 0.004, loop_slack=0.2).agrees
    # a faster outside figure than reported does not count against a candidate ...
    assert outside_clock.judge(0.6, 100, 0.5, 100, 5.0, 0.0, 0.0, 0.0).agrees
    # ... unless its loop ran faster than the loop without its call beyond the band: it
    # skipped the loop's own work (padding), which would hide its call's time
    short = outside_clock.judge(0.5, 100, 0.55, 100, 0.3, 0.1, 0.004, loop_slack=0.05, pad_ms=0.1)
    assert short.short_loop and not short.agrees
    assert not outside_clock.judge(0.5, 100, 0.55, 100, 0.3, 0.1, 0.004, loop_slack=0.2, pad_ms=0.1).short_loop
    # without padding (the CPU) there is nothing to skip that the digests would not catch
    assert not outside_clock.judge(0.5, 100, 0.55, 100, 0.3, 0.1, 0.004, loop_slack=0.05, check_short=False).short_loop


def test_the_outside_clock_runs_more_windows_only_while_contradicted():
    honest = outside_clock.judge(0.6, 100, 0.5, 100, inside_ms=0.98, rel_band=0.1, abs_band_ms=0.004, loop_slack=0.0)
    forged = outside_clock.judge(0.6, 100, 0.5, 100, inside_ms=0.3, rel_band=0.1, abs_band_ms=0.004, loop_slack=0.0)
    more = outside_clock.another_window
    # the first windows always run
    assert more(None, 0, first=1, most=2) and more(honest, 1, first=2, most=3)
    # an honest figure confirmed by them ends the clock's work; a contradicted one gets another window ...
    assert not more(honest, 1, first=1, most=2)
    assert more(forged, 1, first=1, most=2)
    # ... up to the most allowed, whatever the judgement then
    assert not more(forged, 2, first=1, most=2)
    assert not more(None, 1, first=3, most=1)


def _windows_of(walls: list[float], inside_ms: float, quiet_at: int | None = None):
    """Run the outside clock's windows over scripted candidate-loop walls (the trusted loop's
    0.5 s each): the judgement, the windows run, and when the starting spare was waited for."""
    run: list[float] = []
    waited: list[int] = []

    def window():
        run.append(walls[len(run)])
        return outside_clock.judge(min(run), 100, 0.5, 100, inside_ms, 0.1, 0.004, loop_slack=0.0)

    def quiet() -> float:
        waited.append(len(run))
        return 4.5

    return outside_clock.run_windows(window, first=1, most=2, floors=False, quiet=quiet), len(run), waited


def test_a_contradicted_figure_is_measured_again_once_a_starting_worker_is_ready():
    # an honest 1 ms call whose first two windows a starting spare worker lengthened
    clock, ran, waited = _windows_of([0.7, 0.68, 0.61, 0.9], inside_ms=1.0)
    assert clock.agrees and ran == 3 and waited == [2] and clock.quiet_wait_s == 4.5
    # a forged figure stays contradicted: as many windows again, then the verdict
    clock, ran, waited = _windows_of([0.6] * 5, inside_ms=0.3)
    assert not clock.agrees and ran == 4 and waited == [2]
    # an honest figure confirmed at once waits for nothing
    clock, ran, waited = _windows_of([0.6] * 5, inside_ms=0.98)
    assert clock.agrees and ran == 1 and waited == [] and clock.quiet_wait_s is None


def test_on_the_cpu_the_outside_clock_runs_more_windows_while_its_figure_decides():
    # the CPU's decided figure is never below the outside one: a window whose trusted loop was
    # paused shortens it, so while it is above the candidate's own, more windows run
    slower = outside_clock.judge(0.6, 100, 0.5, 100, inside_ms=0.9, rel_band=1.0, abs_band_ms=5.0, loop_slack=2.0)
    faster = outside_clock.judge(0.6, 100, 0.5, 100, inside_ms=1.2, rel_band=1.0, abs_band_ms=5.0, loop_slack=2.0)
    assert slower.agrees and slower.outside_ms > slower.inside_ms
    more = outside_clock.another_window
    assert more(slower, 1, first=1, most=3, floors=True) and not more(slower, 3, first=1, most=3, floors=True)
    assert not more(faster, 1, first=1, most=3, floors=True)  # its own figure decides
    assert not more(slower, 1, first=1, most=3)  # a figure that is not floored (a GPU loop the device paces)
    # a stalled trusted window makes the outside figure zero or less: unresolved, so another
    # window, whatever the candidate's own figure says (a forged one is tiny)
    stalled = outside_clock.judge(0.5, 100, 0.6, 100, inside_ms=0.001, rel_band=1.0, abs_band_ms=5.0, loop_slack=2.0)
    assert stalled.outside_ms < 0 and stalled.agrees
    assert more(stalled, 1, first=1, most=3, floors=True) and not more(stalled, 3, first=1, most=3, floors=True)


def _floored_windows(run_walls: list[float], loop_walls: list[float], inside_ms: float, loop_again: bool = True):
    """A CPU's windows over scripted walls of 100 calls: each window takes the next candidate
    wall and trusted wall, a trusted loop alone the next trusted wall. (the judgement, the
    windows run, the trusted loops run)"""
    run: list[float] = []
    loops: list[float] = []

    def judged():
        clock = outside_clock.judge(min(run), 100, min(loops), 100, inside_ms, 1.0, 5.0, loop_slack=2.0)
        return clock.model_copy(update={"windows": len(run), "loop_windows": len(loops)})

    def window():
        run.append(run_walls[len(run)])
        loops.append(loop_walls[len(loops)])
        return judged()

    def again():
        loops.append(loop_walls[len(loops)])
        return judged()

    clock = outside_clock.run_windows(
        window, first=1, most=3, floors=True, quiet=lambda: 0.0, loop_again=again if loop_again else None
    )
    return clock, len(run), len(loops)


def test_a_floored_figure_is_not_left_to_a_forged_median_by_one_stalled_trusted_loop():
    # as a CPU suite run saw it: calls of 0.05 ms, a median forged to 1 us, and the one trusted
    # window stalled by about what the calls cost (5 ms over 100 calls), so the outside figure
    # came out at 0.0005 ms, positive and below the forgery, and the forgery decided
    stalled = [0.01495, 0.0100, 0.0100, 0.0100, 0.0100]
    clock, _, loops = _floored_windows([0.0150] * 5, stalled, inside_ms=0.001, loop_again=False)
    assert loops == 1 and 0 < clock.outside_ms <= 0.001
    # the trusted loop run once more before the candidate's own figure decides: its shortest
    # shows the calls' cost, which floors the forgery, and the windows go on as for any floor
    clock, ran, loops = _floored_windows([0.0150] * 5, stalled, inside_ms=0.001)
    assert clock.loop_windows == loops and loops >= 2
    assert clock.outside_ms == pytest.approx(0.05) and clock.outside_ms > clock.inside_ms
    # an honest figure that its trusted loop confirms costs that one trusted loop more, no window
    clock, ran, loops = _floored_windows([0.0150] * 5, [0.0100] * 5, inside_ms=0.06)
    assert (ran, loops) == (1, 2) and clock.outside_ms == pytest.approx(0.05)
    # nor does a floored figure: the windows that floors run decide, as before
    clock, ran, loops = _floored_windows([0.0150] * 5, [0.0100] * 5, inside_ms=0.03)
    assert (ran, loops) == (3, 3) and clock.outside_ms > clock.inside_ms


def _host_bound_windows(walls: list[float], inside_ms: float, retry_floor: bool = True):
    """A host-bound GPU loop's windows over scripted candidate walls of 100 calls (the trusted
    loop's 0.5 s each): the judgement, the windows run, and when the starting spare was waited for."""
    run: list[float] = []
    waited: list[int] = []

    def judged():
        clock = outside_clock.judge(min(run), 100, 0.5, 100, inside_ms, 0.1, 0.05, loop_slack=1.5, host_bound=True)
        return clock.model_copy(update={"windows": len(run)})

    def window():
        run.append(walls[len(run)])
        return judged()

    def quiet() -> float:
        waited.append(len(run))
        return 0.5

    clock = outside_clock.run_windows(
        window, first=1, most=2, floors=True, quiet=quiet, loop_again=judged, retry_floor=retry_floor
    )
    return clock, len(run), waited


def test_a_host_bound_gpu_floor_stands_only_if_windows_after_a_quiet_wait_keep_it():
    # an honest 0.06 ms call whose first windows a pause lengthened by 10 ms (0.1 ms a call):
    # floored, it was a false REVERT or a pairing; measured again after the wait, it stands
    paused = [0.516, 0.516, 0.516, 0.5055, 0.5055, 0.5055]
    clock, ran, waited = _host_bound_windows(paused, inside_ms=0.06)
    assert waited and clock.outside_ms == pytest.approx(0.055) and clock.outside_ms <= clock.inside_ms
    # without the retry the pause floored it
    clock, _, waited = _host_bound_windows(paused, inside_ms=0.06, retry_floor=False)
    assert not waited and clock.outside_ms == pytest.approx(0.16)
    # a forged median (1 us for a 0.06 ms call) is floored in every window: the floor stands
    clock, ran, waited = _host_bound_windows([0.506] * 8, inside_ms=0.001)
    assert waited and ran == 4 and clock.outside_ms == pytest.approx(0.06) and clock.outside_ms > clock.inside_ms
    # an honest figure that its first window confirms waits for nothing
    clock, ran, waited = _host_bound_windows([0.5055] * 8, inside_ms=0.06)
    assert not waited and ran == 1
    # with no worker starting, a floor is measured again once, without a wait, and says so
    run: list[float] = []

    def window():
        run.append(0.506)
        clock = outside_clock.judge(min(run), 100, 0.5, 100, 0.001, 0.1, 0.05, loop_slack=1.5, host_bound=True)
        return clock.model_copy(update={"windows": len(run)})

    clock = outside_clock.run_windows(window, 1, 2, True, quiet=lambda: None, loop_again=None, retry_floor=True)
    assert len(run) == 4 and clock.quiet_wait_s is None and clock.outside_ms > clock.inside_ms


def test_a_host_bound_gpu_loop_floors_the_figure_instead_of_accusing():
    from types import SimpleNamespace

    from guard.cascade import outside_windows as ow
    from guard.config import GuardConfig

    cfg = GuardConfig(confirm_pad_max_ms=0.15)
    gpu = SimpleNamespace(device=SimpleNamespace(kind="cuda"), cfg=cfg)
    # a Triton call whose host time per iteration (0.3 ms, by its own process's account) the
    # capped padding (0.15 ms of 30 us passes) cannot cover: the host paces its loop
    assert ow.pad_passes(gpu, 0.3, 0.03) == (5, pytest.approx(0.15), True)
    assert ow.pad_passes(gpu, 0.1, 0.03) == (5, pytest.approx(0.15), False)
    # a finite figure near the largest double once overflowed ceil() and withheld the verdict
    assert ow.pad_passes(gpu, 1e308, 0.03)[::2] == (5, True)
    assert ow.pad_passes(gpu, 0.3, 1e-300)[::2] == (8, True)  # a tiny pass is taken as 0.02 ms
    assert ow.figure_floors(gpu, True) and not ow.figure_floors(gpu, False)
    cpu = SimpleNamespace(device=SimpleNamespace(kind="cpu"), cfg=cfg)
    assert ow.pad_passes(cpu, 0.3, 0.03) == (0, 0.0, False) and ow.figure_floors(cpu, False)
    # as the H200 saw it: 106 us a call outside, 9 us inside; the band would accuse ...
    args = (0.0172, 54, 0.0115, 54, 0.009, 0.1, 0.01, 0.25)
    assert not outside_clock.judge(*args, pad_ms=0.15).agrees
    # ... but the figures measure different things: the outside one decides
    clock = outside_clock.judge(*args, pad_ms=0.15, host_bound=True)
    assert clock.agrees and clock.host_bound
    stats = {"median_ms": 0.009}
    ow.floor_by_outside_clock(stats, clock)
    assert stats["median_ms"] == pytest.approx(clock.outside_ms) and stats["inside_median_ms"] == 0.009
    assert stats["floored_by_outside_clock"]
    # a loop that skipped its padding is still contradicted
    short = outside_clock.judge(0.005, 54, 0.0115, 54, 0.009, 0.1, 0.01, 0.25, pad_ms=0.15, host_bound=True)
    assert short.short_loop and not short.agrees


def test_a_host_bound_gpu_loop_gets_windows_long_enough_for_its_floor():
    """A host-bound window's figure floors the decided one and is the difference of two walls:
    over the timed loop's 50 calls of a small call (15 ms) their jitter floored a 10 us Triton
    call at 19 us on an H100 (session 51). With ``outside_window_s_host`` set, such a window
    runs enough calls for it by the candidate's host time, capped; nothing else changes."""
    from types import SimpleNamespace

    from guard.cascade import outside_windows as ow
    from guard.config import GuardConfig

    cfg = GuardConfig(outside_window_s_host=0.05, outside_calls_most_host=400)
    gpu = SimpleNamespace(device=SimpleNamespace(kind="cuda"), cfg=cfg)
    assert ow.window_calls(gpu, 50, 0.25, True) == 200  # 50 ms at 0.25 ms an iteration
    assert ow.window_calls(gpu, 50, 0.25, False) == 50  # device-bound: judged by the band, as before
    assert ow.window_calls(gpu, 50, 0.01, True) == 400  # capped
    assert ow.window_calls(gpu, 500, 0.01, True) == 500  # never fewer than the timed loop's
    assert ow.window_calls(gpu, 50, 5.0, True) == 50  # an overstated host time: as short as before
    assert ow.window_calls(gpu, 50, 0.0, True) == 400 and ow.window_calls(gpu, 50, 1e308, True) == 50
    cpu = SimpleNamespace(device=SimpleNamespace(kind="cpu"), cfg=cfg)
    assert ow.window_calls(cpu, 50, 0.25, True) == 50  # a CPU's windows are set by its first
    off = SimpleNamespace(device=SimpleNamespace(kind="cuda"), cfg=GuardConfig())
    assert ow.window_calls(off, 50, 0.25, True) == 50  # off by default until measured on a GPU
    # the candidate's loop is made for as many calls as a window may ask, only where one may
    assert [ow.least_loop_calls(r) for r in (gpu, cpu, off)] == [400, 0, 0]


def test_the_outside_clock_checks_the_median_that_decides():
    # a median forged while the mean and the event windows were kept is judged by the median
    stats = {
        "method": "cuda-graph+cupti",
        "event_median_ms": 0.02,
        "event_mean_ms": 0.02,
        "mean_ms": 0.01,
        "median_ms": 0.001,
    }
    assert outside_clock.inside_figure_ms(stats) == 0.001


def test_messages_are_validated_at_both_ends():
    raw = m.Run(run_seed=3).model_dump(mode="json")
    assert isinstance(m.parse_candidate_request(raw), m.Run)
    with pytest.raises(m.MessageError, match="run_seed"):
        m.parse_candidate_request({"op": "run"})
    with pytest.raises(m.MessageError):
        m.parse_candidate_request({"op": "time", "sets": []})  # the old protocol's op
    with pytest.raises(m.MessageError):
        m.parse_trusted_request({"op": "run", "run_seed": 1})  # a candidate op to the trusted worker
    row = [float(i) for i in range(m.DIGEST_WIDTH)]
    reply = m.parse_reply({"ok": True, "digests": [[row]]}, m.RunReply)
    assert reply.digests[0][0][3] == 3.0
    with pytest.raises(m.MessageError):
        m.parse_reply({"ok": True, "digests": "forged", "stats": {}}, m.RunReply)
    failed = m.parse_reply({"ok": False, "status": "RUNTIME_ERROR", "message": "boom"}, m.RunReply)
    assert not failed.ok and failed.status == "RUNTIME_ERROR"


def test_frozen_stops_a_whole_tree_and_resumes_it():
    # the child spins (running, not sleeping): it must be seen stopped as soon as the block starts
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'while True: pass']); "
            "time.sleep(60)",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while len(descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = descendants(proc.pid)
        assert len(tree) >= 2

        def state(pid: int) -> str:
            text = open(f"/proc/{pid}/stat").read()
            return text[text.rfind(")") + 2]

        with frozen(proc.pid) as stopped:
            assert set(tree) <= set(stopped.pids)
            assert all(state(p) == "T" for p in tree)
        assert stopped.escaped() is None  # nothing ran meanwhile
        time.sleep(0.1)
        assert all(state(p) != "T" for p in tree)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def _spinner():
    """A process that spins (running, not sleeping), killed after the block."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        time.sleep(0.2)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_frozen_sees_a_process_that_ran_while_stopped():
    # a spinner continued in the middle of the block stands for a process that escaped the stop;
    # the check after the block, without the watch that kills it first (tests/test_freeze_watch.py)
    with _spinner() as proc:
        with frozen(proc.pid, watch=False) as fz:
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.3)
        assert fz.escaped() and "ms of CPU time" in fz.escaped()
        assert fz.ran_s > 0.05


def test_frozen_sees_a_process_that_woke_briefly_and_stopped_itself_again():
    # a short wake-up (a timer's SIGCONT, then a launch and a SIGSTOP of its own) uses less CPU
    # than a clock tick: the scheduler's run time still shows it (after the block: no watch)
    with _spinner() as proc:
        with frozen(proc.pid, watch=False) as fz:
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.002)
            os.kill(proc.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 5
            while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
                assert time.monotonic() < deadline
                time.sleep(0.001)
        assert fz.woke == [proc.pid] and not fz.running, fz
        assert fz.escaped()


def test_frozen_stops_a_chain_of_processes_that_fork_and_exit():
    """Each generation forks the next and exits at once (the red team's escape): the stop reads
    the tree again until nothing new appears, so the chain makes no progress inside the block,
    or the guard is told that it could not be stopped."""
    from guard.runner.freeze import FreezeError

    counter = Path(tempfile.mkdtemp()) / "generations"
    chain = (
        "import os, sys\n"
        f"path = {str(counter)!r}\n"
        "n = 0\n"
        "while True:\n"
        "    n += 1\n"
        "    if n % 64 == 0:\n"
        "        open(path, 'w').write(str(n))\n"
        "    if os.fork():\n"
        "        os._exit(0)\n"
    )
    # the root reaps orphans, as the sandbox's init (PID 1 of its namespace) does: without it
    # each generation would leave the tree for the machine's init
    root = (
        "import ctypes, subprocess, sys, time\n"
        "ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER\n"
        f"subprocess.Popen([sys.executable, '-c', {chain!r}])\n"
        "time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", root],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not counter.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counter.exists()
        try:
            with frozen(proc.pid) as fz:
                first = counter.read_text()
                time.sleep(0.3)
                assert counter.read_text() == first, "the chain went on while stopped"
            assert fz.escaped() is None
        except FreezeError as exc:
            assert exc.growing
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class _Activity:
    """What ``marked_call_spans`` reads of one CUPTI record."""

    def __init__(self, name: str, corr: int, start: int, dur: int, host: bool = False):
        self._name, self._corr, self._start, self._dur, self._host = name, corr, start, dur, host

    def name(self):
        return self._name

    def correlation_id(self):
        return self._corr

    def start_ns(self):
        return self._start

    def duration_ns(self):
        return self._dur

    def device_type(self):
        return "DeviceType.CPU" if self._host else "DeviceType.CUDA"


def test_eager_calls_are_timed_by_the_device_work_between_markers():
    from guard.runner.cupti_spans import MARKER_KERNEL, marked_call_spans

    events = [
        _Activity("refill", 1, 0, 500),
        _Activity(MARKER_KERNEL, 2, 1000, 10),
        _Activity("rmsnorm", 3, 3000, 4000),  # the call: 4 us ...
        _Activity("cudaLaunchKernel", 3, 2000, 100, host=True),
        _Activity(MARKER_KERNEL, 4, 9000, 10),
        _Activity("digest", 5, 9100, 2000),  # ... not the guard's digest after it
        _Activity(MARKER_KERNEL, 6, 20000, 10),
        _Activity("a", 7, 21000, 1000),  # two kernels, one on another stream: first start to last end
        _Activity("b", 8, 21500, 2500),
        _Activity(MARKER_KERNEL, 9, 25000, 10),
    ]
    spans, why = marked_call_spans(events, 2)
    assert why is None and spans == [0.004, 0.003]
    # a call that launched its own marker, or none of its work: no spans, and why
    assert marked_call_spans(events + [_Activity(MARKER_KERNEL, 10, 30000, 10)], 2)[0] is None
    spans, why = marked_call_spans([e for e in events if e.name() not in ("a", "b")], 2)
    assert spans is None and "1 of 2" in why


def test_digest_allows_what_a_matched_ratio_lets_through():
    """SOL-ExecBench's required_matched_ratio lets a share of the elements miss; the digest
    check of timed calls must allow them as the correctness comparison does (each at most
    OUTLIER_FACTOR times its allowance)."""
    gen = torch.Generator().manual_seed(4)
    ref = torch.randn(1000, generator=gen, dtype=torch.float64)
    out = ref.clone()
    off = ref.abs().argsort(descending=True)[:10]  # 1% of the elements, the largest
    out[off] += 7.5 * 1e-3 * ref[off].abs() * ref[off].sign()
    projection = replays.Projection(9)
    got = replays.digest([out], projection)[0].tolist()
    strict = replays.digest_bounds(ref, 0.0, 1e-3, projection)
    ratio = replays.digest_bounds(ref, 0.0, 1e-3, projection, matched_ratio=0.99)
    assert replays.digest_mismatch(got, *ratio, "y") is None
    # the allowance grows by the misses the ratio permits, each at the outlier bound
    worst = 8.0 * 1e-3 * float(ref.abs().max())
    assert ratio[1][0] == pytest.approx(strict[1][0] + 10 * worst)
    assert ratio[1][2] == pytest.approx(strict[1][2] + math.sqrt(10) * worst)
    # an answer for other inputs still fails
    other = replays.digest([torch.randn(1000, generator=gen, dtype=torch.float64)], projection)[0].tolist()
    assert replays.digest_mismatch(other, *ratio, "y") is not None


def test_float8_inputs_are_redrawn_too():
    """float8 has no normal_: its inputs are drawn through a float16 buffer (an honest fp8
    candidate once failed in warm-up)."""
    gen = torch.Generator().manual_seed(2)
    t = torch.zeros(16, 8, dtype=torch.float8_e4m3fn)
    scratch: dict = {}
    redraw(t, Draw(0, "t", "float"), gen, scratch)
    first = t.float().clone()
    redraw(t, Draw(0, "t", "float"), gen, scratch)
    # one float16 buffer and one of row scales, made once
    assert first.abs().sum() > 0 and not torch.equal(first, t.float()) and len(scratch) == 2


def test_refill_buffers_are_not_keyed_by_an_inputs_address():
    """The trusted worker makes every checked call's inputs anew, and a freed input's address
    is soon another input's, of another shape: a buffer found by address then had the wrong
    shape (every CPU verdict failed in a test run: "output with shape [4096] doesn't match the
    broadcast shape [1, 4096]"). Two inputs at one address, of two shapes, each get theirs."""
    gen = torch.Generator().manual_seed(1)
    scratch: dict = {}
    floats = torch.empty(4096)
    redraw(floats.view(1, 4096), Draw(0, "a", "float"), gen, scratch)
    redraw(floats, Draw(0, "b", "float"), gen, scratch)  # the same address, another shape
    ints = torch.empty(9, dtype=torch.int64)
    for n in (5, 9):
        redraw(ints[:n], Draw(0, "o", "offsets", bound=100), gen, scratch)
        assert ints[0] == 0 and ints[n - 1] == 100 and bool((ints[1:n] >= ints[: n - 1]).all())


def test_timed_float_inputs_have_rows_at_their_own_scales():
    """Every row of a redrawn float input is standard normal times its own factor in [1/2, 2],
    drawn from the seed: the same in every worker given the seed, never the same for two
    seeds, and not the standard-normal rows a kernel could take for granted (red team,
    session 27: a softmax that took each row's sum for its expectation passed)."""
    t = torch.empty(256, 4096)
    redraw(t, Draw(0, "t", "float"), torch.Generator().manual_seed(3), {})
    rms = t.pow(2).mean(-1).sqrt()
    assert rms.min() > 0.45 and rms.max() < 2.2 and rms.min() < 0.6 and rms.max() > 1.7
    again = torch.empty(256, 4096)
    redraw(again, Draw(0, "t", "float"), torch.Generator().manual_seed(3), {})
    assert torch.equal(t, again)
    redraw(again, Draw(0, "t", "float"), torch.Generator().manual_seed(4), {})
    assert not torch.equal(t, again)
    # half precision too, its scales kept in its own dtype: a bfloat16 weight times float32
    # scales took a mixed-dtype path 25 times slower on the CPU, on every timed call
    for dtype in (torch.bfloat16, torch.float16):
        h, scratch = torch.empty(256, 4096, dtype=dtype), {}
        redraw(h, Draw(0, "h", "float"), torch.Generator().manual_seed(3), scratch)
        rms = h.float().pow(2).mean(-1).sqrt()
        assert rms.min() > 0.45 and rms.max() < 2.2 and rms.min() < 0.6 and rms.max() > 1.7
        assert [b.dtype for b in scratch.values()] == [dtype]


def test_counts_from_the_candidates_process_are_bounded():
    """A plan outside the guard's iteration bounds, or a loop that stopped short without the
    guard's clock seeing it reach the time limit, is REWARD_HACK: a short loop would put a
    window's fixed costs into each call's share of the outside clock's band."""
    from guard.cascade.reasons import Rejection
    from guard.cascade.timed_workload import _check_counts
    from guard.problems.schema import Workload

    w = Workload(uuid="w", axes={}, inputs={})
    timing = m.TimingConfig(min_iters=50, max_iters=500, target_time_s=0.2, warmup_time_s=0.05)
    _check_counts(m.Plan(method="cuda-graph", iters=200, n_sets=2), 200, 0.3, timing, 20.0, w)
    _check_counts(m.Plan(method="host-clock", iters=200, n_sets=2), 7, 19.5, timing, 20.0, w)  # time limit
    for plan, n, run_s in (
        (m.Plan(method="cuda-graph", iters=2, n_sets=2), 2, 0.1),
        (m.Plan(method="host-clock", iters=200, n_sets=2), 7, 0.5),
        (m.Plan(method="cuda-graph", iters=200, n_sets=2), 150, 30.0),
    ):
        with pytest.raises(Rejection) as err:
            _check_counts(plan, n, run_s, timing, 20.0, w)
        assert err.value.status == "REWARD_HACK"


def test_digest_table_keeps_one_row_per_call_as_the_digest_computes_it():
    """``replays.DigestTable``: row i is the digest of set k's buffers as they were after call
    i, its elements sampled at call i's positions (here eagerly, as on the CPU; on a GPU each
    set's digest is a captured graph doing the same), a reset starts again at row 0, and no
    more rows are read than were made."""
    projection = replays.Projection(11, calls=4)
    static = [[torch.zeros(3, 70, dtype=torch.float32)], [torch.zeros(5, dtype=torch.float32)]]
    table = replays.DigestTable("cpu", static, 4, projection, graphs=False)
    expected = []
    for i, k in enumerate([0, 1, 0]):
        static[k][0].normal_(generator=torch.Generator().manual_seed(i))
        table.step(k)
        expected.append(replays.digest(static[k], projection, i).tolist())
    assert table.read(3) == expected
    table.reset()
    static[1][0].fill_(2.0)
    table.step(1)
    assert table.read(1) == [replays.digest(static[1], projection, 0).tolist()]
    with pytest.raises(ValueError):
        table.read(5)
    with pytest.raises(ValueError):  # rows need positions drawn for as many calls
        replays.DigestTable("cpu", static, 5, projection, graphs=False)


@pytest.mark.parametrize("extra", [0, 12345])
@pytest.mark.parametrize("periods", [0, 1, 3, 9])
def test_digests_of_any_size_equal_the_figures_in_one_piece(periods, extra):
    """One block or several (64 MiB of float64 at a time at least: a few launches on a GPU, not
    tens), whole periods or a tail: the digest equals the figures computed in one piece."""
    projection = replays.Projection(5)
    period = projection.period
    x = torch.randn(periods * period + extra, dtype=torch.float32)
    if not x.numel():
        x = torch.randn(7)
    got = replays.digest([x], projection)[0].tolist()
    signs = projection.weights(torch.device("cpu"))[1]
    flat = x.to(torch.float64)
    signs = signs.repeat(periods + 1)[: flat.numel()]
    want = [flat.sum().item(), flat.abs().sum().item(), flat.norm().item(), (flat * signs).sum().item()]
    fields = len(replays.DIGEST_FIELDS)
    assert got[:fields] == pytest.approx(want, rel=1e-9, abs=1e-6)
    # then the sampled elements, exactly, at the positions the seed gives for this size
    assert got[fields:] == flat[projection.positions(flat.numel(), torch.device("cpu"))].tolist()


def test_a_digest_holds_one_float64_block_at_a_time():
    """The digest of a large output copies it to float64 a block at a time. Holding every
    block until the end made it a whole float64 copy (2x a float32 output), twice on a GPU
    (the warm-up and the capture): the outside clock's loops held 3.55x a KernelBench call's
    own memory on the H200. Every float64 block made is watched: at most one is alive when the
    next one is made."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    projection = replays.Projection(9)
    period = projection.period
    big = period * 8  # a float64 block has at least 8 periods

    class Watch(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.alive: list[weakref.ref] = []
            self.most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float64 and out.numel() >= big:
                self.alive = [r for r in self.alive if r() is not None]
                self.alive.append(weakref.ref(out))
                # views of one block (its reshapes) share its memory: count memory, not tensors
                held = {t.untyped_storage().data_ptr() for t in (r() for r in self.alive) if t is not None}
                self.most = max(self.most, len(held))
            return out

    projection.weights(torch.device("cpu"))
    x = torch.randn(20 * period + 999, dtype=torch.bfloat16)  # three blocks, the last with a tail
    with Watch() as watch:
        got = replays.digest([x], projection)[0].tolist()
    assert watch.most == 1, f"{watch.most} float64 blocks alive at once"
    flat = x.to(torch.float64)
    signs = projection.weights(torch.device("cpu"))[1].repeat(21)[: flat.numel()]
    want = [flat.sum().item(), flat.abs().sum().item(), flat.norm().item(), (flat * signs).sum().item()]
    assert got[: len(replays.DIGEST_FIELDS)] == pytest.approx(want, rel=1e-9, abs=1e-6)


def test_a_digest_row_without_every_field_matches_nothing():
    """An empty row was checked against nothing (the fields were zipped pairwise) and a kernel
    that skipped every timed call was ACCEPTed; the message refuses it, the check does too."""
    from pydantic import ValidationError

    from guard.runner import messages as m

    ref = [float(i) for i in range(replays.DIGEST_WIDTH)]
    allow = [0.1] * replays.DIGEST_WIDTH
    assert replays.digest_mismatch([], ref, allow, "out") is not None
    assert replays.digest_mismatch([1.0, 2.0], ref, allow, "out") is not None
    assert replays.digest_mismatch(ref[: len(replays.DIGEST_FIELDS)], ref, allow, "out") is not None
    assert replays.digest_mismatch(list(ref), ref, allow, "out") is None
    for short in ([], ref[:4], ref[:-1]):
        with pytest.raises(ValidationError):
            m.RunReply(ok=True, digests=[[short]])
    assert m.RunReply(ok=True, digests=[[ref]]).digests == [[ref]]


def test_a_one_block_digest_costs_ten_operations_at_most():
    """The timed loop digests every call's output, each operation tens of microseconds of host
    time under the profiler: an output of one block takes its float64 copy, one product for
    the sum and the projection, the two norms and one stack (whole periods add a row sum, a
    tail the zeros it is padded with), then the sampled elements' gather, their float64 copy
    and the concatenation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:  # a view launches nothing
                self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    projection = replays.Projection(3)
    projection.weights(torch.device("cpu"))
    period = projection.period
    for n, most in ((4096, 8), (period, 9), (2 * period + 4096, 10)):
        x = torch.randn(n, dtype=torch.bfloat16)
        projection.positions(n, torch.device("cpu"))  # drawn once per size, as the loops do first
        with Count() as count:
            replays.digest([x], projection)
        assert len(count.ops) <= most, count.ops


def test_a_tree_that_will_not_stop_is_the_stopped_candidates_doing(monkeypatch):
    """A red team's incumbent held a process in uninterruptible sleep (a vfork child blocked on
    a FIFO), so the stop never completed: that was a guard error, and every challenger paired
    with it failed while it kept the global best. Now the stopped candidate answers for it: a
    challenger is REWARD_HACK, an incumbent is unpaired as REWARD_HACK (and so revoked)."""
    import contextlib
    from types import SimpleNamespace

    from guard.cascade import workload_requests
    from guard.cascade.reasons import Unpaired
    from guard.runner.freeze import FreezeError

    @contextlib.contextmanager
    def never_stops(pid, **kwargs):
        raise FreezeError("the candidate's process tree could not be stopped in 5 s: processes [7] did not stop", False)
        yield  # pragma: no cover

    monkeypatch.setattr(workload_requests, "frozen", never_stops)
    worker = SimpleNamespace(proc=SimpleNamespace(pid=7), cgroup_dir=None)
    w = SimpleNamespace(uuid="w0")
    with pytest.raises(workload_requests.StoppedButRan) as caught:
        with workload_requests.candidate_stopped(worker, w, "while the guard timed its loop"):
            pass
    assert caught.value.status == "REWARD_HACK" and "did not stop" in caught.value.reason
    with pytest.raises(Unpaired) as unpaired:
        with workload_requests.candidate_stopped(worker, w, "while the other candidate was timed", accuse=False):
            pass
    assert unpaired.value.status == "REWARD_HACK"


def test_reported_timing_figures_are_typed_named_and_short():
    """What the candidate's worker reports of its timing enters the verdict only as the
    verdict's Timing names and types it: a figure as text is out of protocol, a field of its
    own is dropped (one nested 250 deep made a stored verdict unreadable), the guard's own
    fields cannot be sent, and a text is cut to a line."""
    from guard.cascade.reasons import Rejection
    from guard.cascade.timed_workload import _reported_figures
    from guard.problems.schema import Workload

    w = Workload(uuid="w1", axes={})
    figures = _reported_figures(
        {
            "median_ms": 0.5,
            "rel_se": 0.01,
            "n": 100,
            "cupti_error": "x" * 10_000,
            "note": {"x": {"x": {}}},
            "floored_by_outside_clock": True,
        },
        w,
    )
    assert figures == {"median_ms": 0.5, "rel_se": 0.01, "n": 100, "cupti_error": "x" * 300}
    with pytest.raises(Rejection, match="out of protocol"):
        _reported_figures({"median_ms": 0.5, "rel_se": "0.01"}, w)


def test_repeats_compare_bitwise_or_within_the_tolerance_the_problem_allows():
    """The determinism check's two calls on the same inputs (``_repeat_differs``): bitwise by
    default; where a problem allows repeats to differ, by each output's tolerance, so that float
    atomics pass and a race or uninitialised memory does not."""
    from guard.runner.candidate_role import _repeat_differs

    first = torch.linspace(-1, 1, 4096)
    atomics = first + torch.randn(4096) * 1e-7  # a different summation order's rounding
    racy = first.clone()
    racy[17] = 3.0  # an element another thread overwrote
    loose = [m.Tolerance(atol=1e-5, rtol=1e-5)]
    assert "non-deterministic" in (_repeat_differs(["y"], [atomics], [first], None) or "")
    assert _repeat_differs(["y"], [first.clone()], [first], None) is None
    assert _repeat_differs(["y"], [atomics], [first], loose) is None
    why = _repeat_differs(["y"], [racy], [first], loose)
    assert why is not None and "'y'" in why and "1 of 4096 elements outside atol=1e-05" in why
    # the repeat is judged as the reference comparison is: a few rounding-size misses that the
    # problem's matched ratio lets through pass, an error the size of a defect does not
    ratio = [m.Tolerance(atol=1e-5, rtol=1e-5, required_matched_ratio=0.99)]
    rounding = first.clone()
    rounding[17] += 4e-5  # beyond atol + rtol * |x|, within a few rounding units
    assert _repeat_differs(["y"], [rounding], [first], loose) is not None
    assert _repeat_differs(["y"], [rounding], [first], ratio) is None
    assert "defect" in (_repeat_differs(["y"], [racy], [first], ratio) or "")
    capped = [m.Tolerance(atol=1e-5, rtol=1e-5, required_matched_ratio=0.99, max_error_cap=1e-5)]
    assert "max_error_cap" in (_repeat_differs(["y"], [rounding], [first], capped) or "")
    nan = first.clone()
    nan[3] = float("nan")
    assert _repeat_differs(["y"], [nan.clone()], [nan], loose) is None  # NaN where NaN was
    assert _repeat_differs(["y"], [first], [nan], loose) is not None


def test_the_host_time_set_at_arm_is_a_warm_loops():
    """The padding of a GPU's outside-clock windows is set from the host's time to enqueue one
    iteration of its loop, measured at arm. The loop's first run launches each of its graphs
    for the first time; a figure taken from it alone left some loops host-bound and not others
    of one kernel. Here the first run's calls each cost 20 ms more, the later ones nothing."""
    maker = _maker()
    sets = [maker.make({}, {"n": 4}, seed=1)]
    static = [[torch.zeros(4, 64, dtype=torch.bfloat16)]]
    runs = {"calls": 0}

    def call(k):
        runs["calls"] += 1
        if runs["calls"] <= 3:  # the first run's: cold
            time.sleep(0.02)
        static[k][0].copy_(sets[k][0] * 2)

    loop = _confirm_loop(sets, static)
    host_ms = loop.warm_host_ms(seed=3, iters=3, call=call)
    assert runs["calls"] == 3 * (1 + confirm.WARM_HOST_RUNS)
    assert host_ms == loop.host_ms_per_iter < 10, host_ms  # not the cold run's 20 ms a call
