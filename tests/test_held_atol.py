"""The atol an output is held to shrinks with the reference's own size (``runner/held_atol.py``).

The audit of session 37 found outputs far below the absolute tolerance they were judged by,
so that zeros or a scaled answer passed every element-wise check: a softmax over many
columns, a vector divided by its norm, bf16 attention at long contexts, the "tiny" rounds.
Each case is here at its real size, with the honest answers that must still pass: another
order of operations, a bf16 kernel against a float32-accumulating reference, and outputs that
cancel to near zero, where only the reference's own error against float64 says how close an
honest kernel can come.
"""

from __future__ import annotations

import math

import pytest
import torch

from guard.runner import messages as m
from guard.runner import replay_check, replays
from guard.runner.compare import compare, judge
from guard.runner.held_atol import ReferenceGap, held_atol, reference_gap, rms

FP32 = (1e-4, 1e-4)  # float32's default (atol, rtol)
BF16 = (1e-2, 1e-2)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_nothing_changes_where_outputs_are_of_unit_size():
    h = held_atol(1e-2, 1e-2, rms=1.0)
    assert h.atol == 1e-2 and not h.scaled and h.note() == ""


def test_the_atol_follows_the_outputs_size_down_to_its_floors():
    assert held_atol(1e-4, 1e-4, rms=3e-3).atol == pytest.approx(3e-6)
    assert held_atol(1e-4, 1e-4, rms=1e-12).atol == pytest.approx(1e-15)  # a "tiny" round's outputs
    assert held_atol(1e-4, 1e-4, rms=1e-6, gap=ReferenceGap(1e-7, 1e-9)).atol == pytest.approx(1e-6)
    assert held_atol(1e-4, 1e-4, rms=1e-6, gap=ReferenceGap(1.0, 1e-9)).atol == 1e-4  # never above the stated
    assert held_atol(1e-4, 1e-4, rms=1e-6, gap=ReferenceGap(1e-7, 1e-7)).atol == 1e-4  # mostly rounding
    assert "scaled from 0.0001" in held_atol(1e-4, 1e-4, rms=3e-3).note()


def test_an_absolute_tolerance_by_intent_a_zero_reference_or_a_non_finite_size_keep_the_stated():
    assert held_atol(1e-3, 0.0, rms=1e-6).atol == 1e-3
    assert held_atol(1e-3, 1e-3, rms=math.inf).atol == 1e-3
    assert held_atol(1e-3, 1e-3, rms=0.0).atol == 1e-3


def test_rms_and_reference_gap_skip_non_finite_elements_and_read_in_chunks():
    t = torch.tensor([3.0, 4.0, math.inf, math.nan])
    assert rms(t, chunk_elements=1) == pytest.approx(math.sqrt(12.5))
    gap = reference_gap(torch.tensor([1.0, 2.0, math.nan]), torch.tensor([1.5, 2.0, 0.0]).double(), 2)
    assert gap.largest == 0.5 and gap.rms == pytest.approx(math.sqrt(0.125))


def _judged(out: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor, atol: float, rtol: float) -> bool:
    """As the guard decides: the reference, then, before a numerical failure stands, the
    float64 reference with the reference's gap to it as the floors (``compare.judge``)."""
    return bool(judge(out, ref, lambda: exact, atol, rtol)["ok"])


def test_a_softmax_over_many_columns_answered_with_zeros_fails():
    """KernelBench level 1's 23_Softmax (rows of 393216 float32, outputs near 3e-6): zeros were
    within float32's atol of 1e-4 on all but the largest few elements of a row."""
    x = torch.randn(2, 393216, generator=_gen(0))
    ref = torch.softmax(x, dim=-1)
    exact = torch.softmax(x.double(), dim=-1)
    stated = compare(torch.zeros_like(ref), ref, *FP32, scale=False)  # the stated bound alone
    assert stated["mismatches"] < 1e-4 * ref.numel()  # only the largest few elements missed
    got = compare(torch.zeros_like(ref), ref, *FP32)
    assert got["mismatches"] > 0.9 * ref.numel() and "scaled from 0.0001" in got["message"]
    assert not _judged(torch.zeros_like(ref), ref, exact, *FP32)
    honest = torch.exp(x - x.amax(-1, keepdim=True))
    honest = honest / honest.sum(-1, keepdim=True)
    assert _judged(honest, ref, exact, *FP32)


def test_a_vector_divided_by_its_norm_passes_honest_kernels_that_the_reference_itself_misses():
    """KernelBench level 1's 37_FrobeniusNorm_ (outputs near 2e-5 at its real size, 2e-4 at
    this one). The float32 reference's own norm is off by about 6e-4 of itself here, more than
    rtol: honest kernels pass against the float64 reference, with its error as the floor."""
    x = torch.randn(16, 64, 256, 64, generator=_gen(1))
    ref = x / torch.linalg.vector_norm(x)
    exact = x.double() / torch.linalg.vector_norm(x.double())
    assert not _judged(torch.zeros_like(ref), ref, exact, *FP32)
    assert not _judged(0.9 * ref, ref, exact, *FP32)
    assert _judged(x / x.double().pow(2).sum().sqrt().float(), ref, exact, *FP32)
    assert _judged(
        x / torch.linalg.vector_norm(x.flip(0)), ref, exact, *FP32
    )  # as the reference does, in another order


def test_bf16_attention_scaled_by_nine_tenths_fails_at_long_contexts():
    """A GQA decode step over 8192 keys: outputs near 0.01, under bf16's atol of 1e-2."""
    gen = _gen(2)
    q = torch.randn(8, 128, generator=gen)
    k = torch.randn(8192, 128, generator=gen)
    v = torch.randn(8192, 128, generator=gen)
    p = torch.softmax(q @ k.T / math.sqrt(128), dim=-1)
    ref = (p @ v).to(torch.bfloat16)
    assert compare((0.9 * ref.float()).to(torch.bfloat16), ref, *BF16, scale=False)["ok"]
    assert not compare((0.9 * ref.float()).to(torch.bfloat16), ref, *BF16)["ok"]
    # an honest bf16 kernel: bf16 probabilities and values, float32 sums
    honest = (p.to(torch.bfloat16).float() @ v.to(torch.bfloat16).float()).to(torch.bfloat16)
    assert compare(honest, ref, *BF16)["ok"]


def test_a_tiny_round_answered_with_zeros_fails_and_the_honest_answer_passes():
    """The adversarial "tiny" round scales inputs by 2**-30: RMSNorm's outputs stay of unit
    size, a matmul's fall to 1e-18, far under any atol."""
    gen = _gen(3)
    a = torch.randn(64, 512, generator=gen) * 2.0**-30
    b = torch.randn(512, 256, generator=gen)
    ref = a @ b
    assert not compare(torch.zeros_like(ref), ref, *FP32)["ok"]
    honest = (a.double() @ b.double()).float()
    assert compare(honest, ref, *FP32)["ok"]


def test_a_bf16_matmul_in_another_order_passes():
    gen = _gen(4)
    a = torch.randn(256, 4096, generator=gen).to(torch.bfloat16)
    b = torch.randn(4096, 512, generator=gen).to(torch.bfloat16)
    ref = (a.float() @ b.float()).to(torch.bfloat16)
    exact = a.double() @ b.double()
    # split-K: four float32 partial sums added, one rounding to bf16 at the end
    parts = [a[:, i : i + 1024].float() @ b[i : i + 1024].float() for i in range(0, 4096, 1024)]
    honest = (parts[3] + parts[2] + parts[1] + parts[0]).to(torch.bfloat16)
    assert _judged(honest, ref, exact, *BF16)
    assert compare(honest, ref, *BF16)["ok"]


def _centred_mean(x: torch.Tensor) -> torch.Tensor:
    """A GroupNorm-like output whose exact value is 0 for any input (KernelBench level 2's
    23_Conv3d_GroupNorm_Mean): what is left is each order of operations' rounding."""
    y = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)
    return y.mean(-1)


def test_an_output_that_cancels_to_zero_passes_an_honest_kernel():
    x = torch.randn(128, 4096, generator=_gen(5)) * 3 + 7
    ref = _centred_mean(x)
    exact = _centred_mean(x.double())
    honest = _centred_mean(x.flip(-1))  # another order of the same sums
    assert float(ref.abs().max()) > 0 and float(honest.abs().max()) > 0
    first = compare(honest, ref, *FP32)
    gap = reference_gap(ref, exact)
    # held to the reference alone the honest kernel may miss; against float64, with the
    # reference's own error as the floor, it passes, as the trusted worker decides
    again = compare(honest, exact, *FP32, same_dtype=False, gap=gap)
    assert again["ok"], (first, again)


def test_a_timed_calls_digest_of_zeros_fails_where_the_outputs_are_small():
    """The digests of a GPU's timed calls are held to the same bound: a softmax answered with
    zeros on timed calls only passed the sums, norms and samples under the stated atol."""
    x = torch.randn(4, 16384, generator=_gen(6))
    ref = torch.softmax(x, dim=-1)
    p = replays.Projection(7)
    values, allow = replays.digest_bounds(ref, *FP32, p)
    zeros = replays.digest([torch.zeros_like(ref)], p)[0].tolist()
    assert replays.digest_mismatch(zeros, values, allow, "y") is not None
    honest = torch.exp(x - x.amax(-1, keepdim=True))
    honest = honest / honest.sum(-1, keepdim=True)
    assert replays.digest_mismatch(replays.digest([honest], p)[0].tolist(), values, allow, "y") is None


def test_a_timed_call_that_cancels_to_zero_passes_against_float64_with_the_references_error():
    x = torch.randn(64, 4096, generator=_gen(8)) * 3 + 7
    ref = _centred_mean(x)
    honest = _centred_mean(x.flip(-1))
    p = replays.Projection(9)
    tol = [m.Tolerance(atol=1e-4, rtol=1e-4)]
    row = [replays.digest([honest], p)[0].tolist()]
    why = replay_check.digests_mismatch(row, [ref], tol, ["y"], p, lambda: [_centred_mean(x.double())], 0)
    assert why is None
    zeros_far = [replays.digest([ref + 1e-3], p)[0].tolist()]  # off by far more than the rounding
    assert replay_check.digests_mismatch(zeros_far, [ref], tol, ["y"], p, lambda: [_centred_mean(x.double())], 0)


def test_an_output_that_is_only_rounding_keeps_the_stated_atol():
    """Found by a red-team review (session 38) on KernelBench level 2's
    23_Conv3d_GroupNorm_Mean, whose output is 0 in exact arithmetic: torch.compile's kernel
    and a hand-written lane reduction were 5-40x further from float64 than ATen's cascade
    sums, past ten times the reference's own error, and were rejected (1 round in 3 at the real
    size, every near-zero round). Where the reference's own error is a tenth of its size or
    more, its size is rounding and nothing can be held to it: the stated atol stands. Here the
    same situation in numbers: an exact answer of 1e-17, a reference off by 1e-8, an honest
    kernel off by 20 times that."""
    gen = _gen(10)
    exact = torch.randn(128, generator=gen, dtype=torch.float64) * 1e-17
    ref = (exact + torch.randn(128, generator=gen, dtype=torch.float64) * 1e-8).float()
    honest = (exact + torch.randn(128, generator=gen, dtype=torch.float64) * 2e-7).float()
    assert _judged(honest, ref, exact, *FP32)
    assert not _judged(torch.full_like(ref, 1e-3), ref, exact, *FP32)  # beyond the stated atol still fails
    # a reference that is accurate to a hundredth of its size is held to as before
    small = (torch.randn(128, generator=gen, dtype=torch.float64) * 1e-6).float()
    assert not _judged(small * 0.9, small, small.double(), *FP32)


def test_subnormal_outputs_allow_a_step_of_their_dtype():
    """Small float16 inputs put a matmul's outputs among float16's subnormals (a few steps of
    6e-8 here): two honest orders of operations differ there by a step, which a bound of
    10 x rtol x the outputs' size (2e-9) would call wrong (a review, session 38). The atol is
    never below two steps of the output's dtype (``resolution``)."""
    gen = _gen(11)
    a = (torch.randn(64, 256, generator=gen) * 2.0**-13).to(torch.float16)
    b = (torch.randn(256, 64, generator=gen) * 2.0**-13).to(torch.float16)
    ref = (a.float() @ b.float()).to(torch.float16)
    step = 2.0**-24  # float16's smallest subnormal
    honest = ref.clone()
    honest.view(-1)[::97] += step  # a different rounding on some elements: one step off
    assert 0 < rms(ref) < 1e-6
    assert compare(honest, ref, 1e-3, 1e-3)["ok"]
    assert not compare(torch.zeros_like(ref), ref, 1e-3, 1e-3)["ok"]  # zeros are still far off


CANCELS = """import torch


def run(x):
    assert x.dtype == torch.float32, "this reference runs in float32 only"
    return (x - x.mean(-1, keepdim=True)).sum(-1)
"""
CANCELS_OTHER_ORDER = """import torch


def run(x):
    return x.sum(-1) - x.mean(-1) * x.shape[-1]
"""


def test_without_a_float64_reference_the_stated_atol_decides(tmp_path):
    """The floors of the held atol come from the float64 reference (a review, session 38). A
    reference that cannot run in float64, on an output that is rounding only (a sum of
    deviations from the mean, 0 in exact arithmetic), leaves nothing that sizes the output:
    an honest kernel in another order is judged by the stated atol, and PASSED, through the
    whole guard; one off by more than the stated atol is still rejected."""

    from guard.candidates.load import from_source

    from helpers import make_guard, row_problem_folder, unique

    folder = row_problem_folder(tmp_path, "sum_of_deviations", CANCELS, 256, reduce=True)
    g = make_guard(tmp_path / "ws", correctness_rounds=1, heldout_rounds=1)
    try:
        g.store.import_path(folder)
        v = g.evaluate(from_source(unique(CANCELS_OTHER_ORDER), "pytorch", "kernel.py"), "sum_of_deviations", agent="a")
        assert v.status == "PASSED", v.reason
        off = CANCELS_OTHER_ORDER.replace("* x.shape[-1]", "* x.shape[-1] + 1e-3")
        bad = g.evaluate(from_source(unique(off), "pytorch", "kernel.py"), "sum_of_deviations", agent="b")
        assert bad.status == "INCORRECT_NUMERICAL", bad.reason
    finally:
        g.close()
