"""Paired re-measurement: the decision from the challenger and the incumbent timed turn
about, on the same inputs, in one window.

Repeated evaluations of one kernel in separate processes differ by more than each run's own
spread, and the shifts move a whole run together (docs/benchmarks.md: on the H200 the
6 us workloads of one problem varied 6-16% from run to run while 50 us ones varied 1-2%).
A comparison with an incumbent measured in another window mixes that shift into the
speedup. So when a comparison is not clear-cut, both are timed again in the order
incumbent, challenger, challenger, incumbent (cancelling a linear drift) and the speedup
comes from the paired ratios. This module holds the arithmetic; guard/cascade/pairing_gate.py runs it.
"""

from __future__ import annotations

import math
from typing import TypedDict

from .config import GuardConfig
from . import tails
from .decision import Comparison, decide, incumbent_spread, spread, threshold_from_log


class PairedSamples(TypedDict):
    """One workload's (median, relative standard error) of each side, the i-th incumbent and
    challenger measurement taken side by side."""

    incumbent: list[tuple[float, float]]
    challenger: list[tuple[float, float]]


def needs_pairing(cmp: Comparison | None, band: float = 1.3) -> bool:
    """Re-measure when the stored comparison would ACCEPT or REVERT, but not by a clear
    margin. A stored KEEP (within the threshold) stands: a shift between the two windows
    can only hide a small gain there, never invent one, and resubmissions of an unchanged
    kernel (the common case) then cost no second measurement. Outside ``[1/band, band]`` a
    stored comparison is decisive (``GuardConfig.pairing_band_gpu`` / ``_cpu``)."""
    if cmp is None or decide(cmp) == "KEEP":
        return False
    return 1 / band < cmp.speedup < band


def pairing_rounds(workloads: int, cfg: GuardConfig) -> int:
    """Turns of each side in a paired re-measurement: an even number (the order I C C I
    cancels a linear drift) whose noise estimate has ``pairing_min_dof`` degrees of freedom
    (``workloads * (rounds - 1)``): Student's t at 1 degree of freedom asks for 236 standard
    errors where a normal asks for 3, so one workload timed twice can decide almost nothing."""
    rounds = 2
    while workloads * (rounds - 1) < cfg.pairing_min_dof:
        rounds += 2
    return rounds


def incumbent_slowdown(
    samples: dict[str, PairedSamples],
    incumbent_record: dict[str, tuple[float, float]],
    challenger_record: dict[str, tuple[float, float]],
) -> float | None:
    """How much slower the incumbent ran when timed again than its own record allows: the
    geometric mean, over the turns of the workloads both records hold, of its paired median
    over its stored median times the challenger's drift (the challenger's paired median over
    its own stored one). That is the paired speedup over the stored one; None where no
    workload is in both records.

    The incumbent runs code its agent wrote, and a process can always tell that it is timed
    again without a correctness check first (the requests that reach it): one that ran six
    times slower then made a slower challenger of the same agent an ACCEPT at 2.1x and the
    new global best (red team, session 39). Its record was confirmed by the guard's own clock
    when it was judged, and the challenger cannot move the figure in its own favour (slower
    figures of its own only lower its paired speedup). A slowdown beyond the pairing's own
    noise makes the pairing inconclusive (``pairing_gate``); below it, a slower incumbent
    can only keep a stored comparison from being corrected, never raise it further."""
    logs = []
    for uuid, s in samples.items():
        if uuid not in incumbent_record or uuid not in challenger_record:
            continue
        record_i, record_c = incumbent_record[uuid][0], challenger_record[uuid][0]
        if not (record_i > 0 and record_c > 0):
            continue
        for i, c in zip(s["incumbent"], s["challenger"]):
            if i[0] > 0 and c[0] > 0:  # in logs: no ratio of reported figures can overflow
                logs.append(math.log(i[0]) - math.log(record_i) - math.log(c[0]) + math.log(record_c))
    return math.exp(min(sum(logs) / len(logs), 700.0)) if logs else None


def paired_comparison(samples: dict[str, PairedSamples], cfg: GuardConfig) -> Comparison | None:
    """``samples``: workload -> {"incumbent": [(median, rel_se), ...], "challenger": [...]}
    with the i-th incumbent and challenger measurement taken side by side.

    The standard error of the geometric mean comes from each workload's repetitions (one
    degree of freedom each with two of them, pooled over the workloads as noise of one
    machine); its multiple is Student's t for those degrees of freedom
    (``tails.t_multiplier``), so that a few repetitions that happen to agree on a busy machine
    do not pass for a certainty."""
    logs, variances, dof = [], [], 0
    for s in samples.values():
        pairs = [(i, c) for i, c in zip(s["incumbent"], s["challenger"]) if i[0] > 0 and c[0] > 0]
        if not pairs:
            continue
        lr = [math.log(i[0]) - math.log(c[0]) for i, c in pairs]
        mean = sum(lr) / len(lr)
        # within-run spread of both medians (many iterations each: taken as known), and the
        # disagreement between the repetitions (estimated: len(lr) - 1 degrees of freedom)
        # (the incumbent's no more than the challenger's: ``decision.incumbent_spread``)
        within = sum(spread(c[1], cfg) ** 2 + incumbent_spread(i[1], c[1], cfg) ** 2 for i, c in pairs)
        within /= len(pairs) ** 2
        between = sum((x - mean) ** 2 for x in lr) / (len(lr) * (len(lr) - 1)) if len(lr) > 1 else 0.0
        logs.append(mean)
        variances.append(within + between)
        dof += len(lr) - 1
    if not logs:
        return None
    n = len(logs)
    sigma = math.sqrt(sum(variances) / n**2)
    multiplier = tails.t_multiplier(cfg.noise_sigmas, dof or math.inf)
    return Comparison(math.exp(sum(logs) / n), threshold_from_log(multiplier * sigma, cfg))
