"""softmax_lm_vocab_fp32 is judged relative to each element.

Its outputs lie near 1/vocab (3e-5 at 32000 entries, 7e-6 at 152064), below float32's default
atol of 1e-4: any value near them was within tolerance. Two red-team cheats used that
(``phase_by_version_assumes_standard_normal``, ``phase_by_object_reuse_uniform``): a timed
call answered with the row sum's expectation for standard-normal logits passed the check of
every element on rows whose scale happened to be near 1, and with the tests' few timed calls
the cheat was PASSED, a new global best, once in a suite run (session 37). The problem now sets
float32 atol 1e-8, rtol 1e-4: the stand-in is wrong by its own relative error on every element.
"""

from __future__ import annotations

import math

import torch

from guard.problems import tolerance
from guard.problems.problem import load_problem
from guard.runner.compare import compare, spec_args
from seeds import SEEDS_DIR

VOCAB = 32000


def _stand_in(logits: torch.Tensor) -> torch.Tensor:
    """The cheat's answer: each row's sum taken to be V e^(1/2)."""
    return torch.exp(logits - 0.5 - math.log(logits.shape[-1]))


def test_the_standard_normal_stand_in_fails_the_problems_tolerance_on_every_timed_row_scale():
    problem = load_problem(SEEDS_DIR / "softmax_lm_vocab_fp32", "seed")
    w = next(w for w in problem.workloads if w.axes.get("num_tokens") == 1)
    tol = tolerance.for_workload(problem.definition, w)["probs"]
    assert (tol.atol, tol.rtol, tol.origin) == (1e-8, 1e-4, "kernelarc")
    gen = torch.Generator().manual_seed(0)
    for scale in (0.5, 0.9, 0.97, 1.03, 1.1, 2.0):  # the timed calls' rows are scaled in [1/2, 2]
        logits = torch.randn(1, VOCAB, generator=gen) * scale
        ref = torch.softmax(logits, dim=-1)
        got = compare(_stand_in(logits), ref, tol.atol, tol.rtol, name="output", **spec_args(tol.message()))
        assert not got["ok"], (scale, got)
        # float32's default tolerance as stated passed the same stand-in at scales near 1;
        # held down to the outputs' size (``held_atol``) it fails it too
        if abs(scale - 1) < 0.05:
            stated = compare(_stand_in(logits), ref, 1e-4, 1e-4, name="output", scale=False)
            assert stated["ok"], (scale, stated)
            held = compare(_stand_in(logits), ref, 1e-4, 1e-4, name="output")
            assert not held["ok"] and held["held_atol"] < 1e-6, (scale, held)


def test_an_honest_float32_softmax_passes_it_at_every_scale():
    problem = load_problem(SEEDS_DIR / "softmax_lm_vocab_fp32", "seed")
    w = next(w for w in problem.workloads if w.axes.get("num_tokens") == 1)
    tol = tolerance.for_workload(problem.definition, w)["probs"]
    gen = torch.Generator().manual_seed(1)
    for scale in (1e-3, 0.5, 1.0, 2.0, 30.0, 1e3):  # the mixed round's range, and the timed calls'
        logits = torch.randn(4, VOCAB, generator=gen) * scale
        ref = torch.softmax(logits.double(), dim=-1).float()
        x = logits - logits.amax(-1, keepdim=True)  # another order of operations than torch's
        mine = torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
        got = compare(mine, ref, tol.atol, tol.rtol, name="output", **spec_args(tol.message()))
        assert got["ok"], (scale, got)
