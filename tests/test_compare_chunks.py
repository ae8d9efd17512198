"""A comparison read a chunk at a time reports what it reports over the whole tensor: the
counts, the largest errors and where they are, the first failing element, the row-scaled
allowance of adversarial rounds (rows shorter and longer than a chunk) and exact integers."""

from __future__ import annotations

import pytest
import torch

from guard.runner.compare import compare
from guard.runner.compare_scan import all_finite

WHOLE = 1 << 30  # one chunk holds any tensor here


def _cases():
    gen = torch.Generator().manual_seed(7)
    ref = torch.randn(6, 37, generator=gen)
    off = ref.clone()
    off[2, 5] += 3.0
    off[4, 36] += 0.5
    yield "two wrong", off, ref, {}
    noisy = ref + 1e-3 * torch.randn(6, 37, generator=gen)
    yield "rounding within ratio", noisy, ref, {"matched_ratio": 0.9}
    nan = ref.clone()
    nan[3, 3] = float("nan")
    yield "a NaN", nan, ref, {"matched_ratio": 0.99}
    outlier = ref.clone()
    outlier[5, 1] += 10.0
    yield "an outlier within ratio", outlier, ref, {"matched_ratio": 0.99}
    yield "error cap", noisy, ref, {"error_cap": 1e-4}
    yield "row scaled", off, ref, {"row_scaled": True}
    special = ref.clone()
    special[1, 2] = float("inf")
    yield "same infinity", special.clone(), special, {}


@pytest.mark.parametrize("chunk", [1, 5, 37, 40, 100])
def test_chunks_report_what_the_whole_tensor_reports(chunk):
    for label, out, ref, kw in _cases():
        whole = compare(out, ref, 1e-2, 1e-2, "y", chunk_elements=WHOLE, **kw)
        assert compare(out, ref, 1e-2, 1e-2, "y", chunk_elements=chunk, **kw) == whole, label


@pytest.mark.parametrize("chunk", [1, 5, 37, WHOLE])
def test_a_check_without_figures_gives_the_same_verdict(chunk):
    # the fast path of a check of many outputs: the same verdict for every case; a plain pass
    # without statistics, anything else with the full report (message, counts)
    cases = list(_cases()) + [
        ("exact", (ref := torch.randn(4, 9)).clone(), ref, {}),
        ("within", ref + 1e-4, ref, {}),
        ("within the cap", ref + 1e-4, ref, {"error_cap": 1e-3}),
        ("past the cap", ref + 1e-4, ref, {"error_cap": 1e-5}),
        ("a NaN where the reference is NaN", torch.full((3,), float("nan")), torch.full((3,), float("nan")), {}),
        ("an infinity where it is finite", torch.tensor([float("inf"), 1.0]), torch.tensor([1.0, 1.0]), {}),
    ]
    for label, out, ref_, kw in cases:
        full = compare(out, ref_, 1e-2, 1e-2, "y", chunk_elements=chunk, **kw)
        quick = compare(out, ref_, 1e-2, 1e-2, "y", chunk_elements=chunk, figures=False, **kw)
        assert (quick["ok"], quick["status"]) == (full["ok"], full["status"]), label
        short = {"ok": True, "status": "PASSED"}
        if label in ("exact", "within", "within the cap", "rounding within ratio"):  # plain passes
            assert quick == short, label
        elif quick != full:  # else failures, misses the ratio lets through, matching NaN or infinity
            assert quick == short and full["ok"] and full["mismatches"] == 0, label


def test_the_first_failure_and_the_worst_are_found_across_chunks():
    ref = torch.zeros(10, 10)
    out = ref.clone()
    out[7, 2] = 1.0
    out[9, 9] = 5.0
    rep = compare(out, ref, 1e-3, 1e-3, "y", chunk_elements=3)
    assert not rep["ok"] and rep["mismatches"] == 2 and rep["max_abs"] == 5.0
    assert "first at [7, 2]: got 1, expected 0" in rep["message"]
    assert "max abs error 5 at [9, 9]" in rep["message"]


def test_a_row_longer_than_a_chunk_gets_its_whole_rows_allowance():
    # a row of zeros but for one large value (RMS 100): the allowance of a zero far from it
    # grows with the RMS of the whole row, which no chunk of zeros alone would give
    ref = torch.full((2, 64), 100.0)
    ref[1] = 0.0
    ref[1, 0] = 800.0
    out = ref.clone()
    out[1, 40] = 0.5  # within rtol x row RMS = 1e-2 * 100, outside atol + rtol * 0
    assert compare(out, ref, 1e-2, 1e-2, "y", row_scaled=True, chunk_elements=WHOLE)["ok"]
    assert compare(out, ref, 1e-2, 1e-2, "y", row_scaled=True, chunk_elements=7)["ok"]
    assert not compare(out, ref, 1e-2, 1e-2, "y", row_scaled=False, chunk_elements=7)["ok"]


def test_integers_are_exact_in_chunks():
    ref = torch.arange(50).reshape(5, 10)
    out = ref.clone()
    out[3, 7] = -1
    rep = compare(out, ref, 0.0, 0.0, "i", chunk_elements=4)
    assert rep == compare(out, ref, 0.0, 0.0, "i", chunk_elements=WHOLE)
    assert "1 of 50 elements differ" in rep["message"] and "got -1, expected 37" in rep["message"]


def test_the_float64_recheck_compares_values_of_two_dtypes():
    ref = torch.randn(8, 9, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    assert compare(out, ref, 1e-2, 1e-2, "y")["status"] == "INCORRECT_DTYPE"
    rep = compare(out, ref, 1e-2, 1e-2, "y", chunk_elements=5, same_dtype=False)
    assert rep["ok"], rep


def test_finiteness_is_checked_in_chunks():
    t = torch.ones(1000)
    assert all_finite(t, 7)
    t[999] = float("inf")
    assert not all_finite(t, 7)
    assert all_finite(torch.arange(10), 3)
