"""The correctness rounds' inputs (``guard/runner/inputs.py``): what each adversarial kind
draws, the same in every worker given the same seed."""

from __future__ import annotations

import json

import torch

from guard.runner.inputs import InputMaker

from helpers import SOL_EXAMPLES

RMSNORM = json.loads((SOL_EXAMPLES / "rmsnorm_h4096" / "definition.json").read_text())
WORKLOAD = {"inputs": {"hidden_states": {"type": "random"}, "weight": {"type": "random"}}}


def _inputs(batch: int, seed: int, kind: str) -> list[torch.Tensor]:
    """Each call a fresh maker, as each worker has its own."""
    return InputMaker(RMSNORM, "cpu").make(WORKLOAD, {"batch_size": batch, "hidden_size": 4096}, seed, kind=kind)


def _row_exponents(batch: int, seed: int) -> torch.Tensor:
    hidden, _ = _inputs(batch, seed, "mixed")
    return hidden.float().pow(2).mean(-1).sqrt().log10()


def test_the_mixed_round_spans_its_scales_on_every_draw():
    """With 7 rows, every draw holds a row near 1e-3 and one near 1e3 (each row in its own
    seventh of the range). Drawn independently, about one draw in twenty of rmsnorm's 1- and
    7-row workloads had no row small enough to show a wrong epsilon (1e-6 for 1e-5): the bug
    was then caught on a held-out shape instead, with another reason."""
    width = 6 / 7
    for seed in range(40):
        exps = _row_exponents(7, seed)
        # a row's RMS is its scale to within a few percent over 4096 standard normal elements
        assert exps.min() < -3 + width + 0.05, (seed, exps)
        assert exps.max() > 3 - width - 0.05, (seed, exps)
        strata = sorted(int((e + 3) / width) for e in exps.clamp(-2.999, 2.999).tolist())
        assert len(set(strata)) >= 6, (seed, exps)  # rows in distinct parts of the range


def test_round_inputs_are_the_same_in_every_worker_with_the_same_seed():
    for kind in ("normal", "mixed", "large", "tiny"):
        a, b, c = _inputs(5, 123, kind), _inputs(5, 123, kind), _inputs(5, 124, kind)
        assert all(torch.equal(x, y) for x, y in zip(a, b)), kind
        assert not torch.equal(a[0], c[0]), kind


def test_a_single_row_of_the_mixed_round_stays_within_its_range():
    exps = torch.cat([_row_exponents(1, seed) for seed in range(30)])
    assert exps.min() > -3.1 and exps.max() < 3.1
    assert exps.max() - exps.min() > 2  # not one fixed scale
