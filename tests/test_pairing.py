"""Paired re-measurement: when it happens, its arithmetic, and that it turns a comparison
with a stored measurement from a slow window back into what the kernels really are."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest

from guard.candidates.load import from_source
from guard.config import GuardConfig
from guard.decision import Comparison, decide
from guard.pairing import incumbent_slowdown, needs_pairing, paired_comparison

from helpers import RMS, honest_source, make_guard


def test_only_unclear_accepts_and_reverts_are_remeasured():
    assert not needs_pairing(None)
    assert not needs_pairing(Comparison(1.005, 0.01))  # KEEP stands
    assert not needs_pairing(Comparison(0.995, 0.01))
    assert needs_pairing(Comparison(1.05, 0.01))  # an ACCEPT by a small margin
    assert needs_pairing(Comparison(0.95, 0.01))  # a REVERT by a small margin
    assert not needs_pairing(Comparison(1.6, 0.01))  # clear-cut either way
    assert not needs_pairing(Comparison(0.5, 0.01))
    assert needs_pairing(Comparison(1.6, 0.01), band=2.5)  # the CPU's wider band


def test_paired_arithmetic():
    cfg = GuardConfig()
    same = {
        f"w{i}": {"incumbent": [(1.0, 0.002), (1.02, 0.002)], "challenger": [(1.01, 0.002), (1.01, 0.002)]}
        for i in range(4)
    }
    cmp = paired_comparison(same, cfg)
    assert abs(cmp.speedup - 1) < 0.01 and cmp.threshold >= cfg.noise_floor
    faster = {
        f"w{i}": {"incumbent": [(1.0, 0.001), (1.0, 0.001)], "challenger": [(0.8, 0.001), (0.8, 0.001)]}
        for i in range(4)
    }
    cmp = paired_comparison(faster, cfg)
    assert math.isclose(cmp.speedup, 1.25) and cmp.threshold == cfg.noise_floor
    # repetitions that disagree widen the threshold
    shaky = {"w": {"incumbent": [(1.0, 0.001), (1.0, 0.001)], "challenger": [(0.7, 0.001), (1.0, 0.001)]}}
    assert paired_comparison(shaky, cfg).threshold > 0.1
    assert paired_comparison({"w": {"incumbent": [], "challenger": []}}, cfg) is None


def test_the_incumbents_slowdown_against_its_own_record():
    """A sandbagging incumbent (red team, session 39): timed again, it runs 6x slower than its
    record while the machine is as it was. Its slowdown (the paired speedup over the stored
    one) says so; an honest incumbent on a machine that slowed down for both reads 1."""
    cfg = GuardConfig()
    record_i = {f"w{i}": (1.0, 0.001) for i in range(4)}
    record_c = {f"w{i}": (2.0, 0.001) for i in range(4)}  # the challenger: twice as slow
    sandbagged = {
        f"w{i}": {"incumbent": [(6.0, 0.001), (6.0, 0.001)], "challenger": [(2.0, 0.001), (2.0, 0.001)]}
        for i in range(4)
    }
    paired = paired_comparison(sandbagged, cfg)
    assert paired.speedup > 2.9  # taken at face value: a 3x "gain"
    slowdown = incumbent_slowdown(sandbagged, record_i, record_c)
    assert math.isclose(slowdown, 6.0) and slowdown > 1 + paired.threshold
    slower_machine = {
        f"w{i}": {"incumbent": [(1.5, 0.001), (1.5, 0.001)], "challenger": [(3.0, 0.001), (3.0, 0.001)]}
        for i in range(4)
    }
    assert math.isclose(incumbent_slowdown(slower_machine, record_i, record_c), 1.0)
    # no workload in both records: nothing to say
    assert incumbent_slowdown(sandbagged, {"other": (1.0, 0.0)}, record_c) is None


def test_the_second_red_teams_cases_decide_nothing_false():
    """Red team, session 39, second pass, on the first fix (each turn held to the record):
    an identical kernel whose stored comparison was a lucky 1.4x, beside an incumbent 6x slow
    when timed again, was ACCEPTed; and an honest identical kernel, stored at 0.65x because
    the incumbent's record came from a fast window, was REVERTed. Now the first pairing is
    inconclusive (no ACCEPT), and the second decides from the side-by-side figures (KEEP)
    or is inconclusive (KEEP too): never a REVERT of an identical kernel."""
    cfg = GuardConfig()
    w = [f"w{i}" for i in range(4)]
    # stored 1.4x: the incumbent's record 1.4, the challenger's 1.0; both are truly 1.0
    lucky = {k: {"incumbent": [(6.0, 0.002), (6.1, 0.002)], "challenger": [(1.0, 0.002), (1.01, 0.002)]} for k in w}
    paired = paired_comparison(lucky, cfg)
    slowdown = incumbent_slowdown(lucky, {k: (1.4, 0.0) for k in w}, {k: (1.0, 0.0) for k in w})
    assert decide(paired) == "ACCEPT" and slowdown > 1 + paired.threshold  # inconclusive: no ACCEPT
    # stored 0.65x: the incumbent's record 0.65 (a fast window), the challenger's 1.0
    honest = {k: {"incumbent": [(1.0, 0.002), (1.02, 0.002)], "challenger": [(1.01, 0.002), (1.0, 0.002)]} for k in w}
    paired = paired_comparison(honest, cfg)
    assert decide(paired) == "KEEP"
    slowdown = incumbent_slowdown(honest, {k: (0.65, 0.0) for k in w}, {k: (1.0, 0.0) for k in w})
    assert slowdown > 1 + paired.threshold  # inconclusive as well: KEEP either way


def test_student_t_multiples_match_the_tables():
    from guard.tails import t_multiplier, t_tail

    # two-sided 95% and 99%, one-sided 99.9%, from any t table
    assert math.isclose(2 * t_tail(2.776, 4), 0.05, rel_tol=1e-3)
    assert math.isclose(2 * t_tail(3.169, 10), 0.01, rel_tol=1e-3)
    assert math.isclose(t_tail(318.31, 1), 0.001, rel_tol=1e-3)
    assert t_multiplier(3, math.inf) == 3
    assert 6.5 < t_multiplier(3, 4) < 6.7 and 3.1 < t_multiplier(3, 64) < 3.2
    assert t_multiplier(3, 1) > 200  # one repetition's worth of spread proves next to nothing


def test_a_few_turns_that_happen_to_agree_do_not_make_an_accept():
    """Four workloads, two turns each, log ratios made up for this test: a mean of 0.36 whose
    turns disagree by 0.3-0.4, the size of the disagreement a loaded 2-core machine showed for
    one kernel timed against itself. The normal multiple (3 standard errors) says ACCEPT;
    Student's t at 4 degrees of freedom does not."""
    cfg = GuardConfig(pairing_min_dof=1)
    ratios = [(0.15, 0.55), (0.50, 0.20), (0.20, 0.55), (0.55, 0.20)]
    turns = {
        f"w{i}": {"incumbent": [(math.exp(a), 0.03), (math.exp(b), 0.03)], "challenger": [(1.0, 0.03), (1.0, 0.03)]}
        for i, (a, b) in enumerate(ratios)
    }
    cmp = paired_comparison(turns, cfg)
    assert 1.35 < cmp.speedup < 1.45
    sigma = math.log(1 + cmp.threshold) / 6.6
    assert cmp.speedup > math.exp(3 * sigma), "the normal multiple would have said ACCEPT"
    assert decide(cmp) == "KEEP", cmp


def test_thresholds_are_margins_on_the_log_of_the_speedup():
    from guard.decision import threshold_from_log

    cfg = GuardConfig()
    # 0.35 on the log scale is a 1.42x speedup, not 1.35x
    assert math.isclose(threshold_from_log(0.35, cfg), math.exp(0.35) - 1)
    assert threshold_from_log(0.001, cfg) == cfg.noise_floor
    assert decide(Comparison(1.40, threshold_from_log(0.35, cfg))) == "KEEP"


def test_a_reported_spread_cannot_raise_a_threshold_past_its_cap():
    """A red team's incumbent reported a relative standard error of 1000 with honest, slow
    medians: its threshold became 5e23%, and an honest challenger 17x faster was only KEEP and
    never took the global best. The spread a threshold uses is capped (``rel_se_cap``), in the
    stored comparison and in the paired one."""
    from guard.decision import compare

    cfg = GuardConfig()
    slow = {"a": (30.0, 1000.0), "b": (30.0, 1000.0)}
    fast = {"a": (1.0, 0.01), "b": (1.0, 0.01)}
    c = compare(fast, slow, cfg)
    assert c is not None and c.speedup == pytest.approx(30.0)
    # and the incumbent's counts no more than the challenger's own (the test below)
    capped = math.expm1(cfg.noise_sigmas * math.sqrt(2 * (0.01**2 + 0.01**2)) / 2)
    assert c.threshold == pytest.approx(capped) and decide(c) == "ACCEPT"
    paired = paired_comparison(
        {w: {"incumbent": [(30.0, 1000.0)] * 2, "challenger": [(1.0, 0.01)] * 2} for w in ("a", "b")}, cfg
    )
    assert paired is not None and decide(paired) == "ACCEPT"


def test_an_incumbent_cannot_widen_the_bar_against_it_with_its_own_spread():
    """Red team, session 45: an incumbent that reported every workload's spread at the cap
    (10%) made a stored comparison's bar about 16% on four workloads, and a stored KEEP is
    never paired, so an honest challenger 1.12x faster stayed KEEP and the title stayed. The
    incumbent's spread now counts no more than the challenger's: the stored comparison is an
    ACCEPT inside the pairing band (re-measured side by side), and in the pairing the bar comes
    from the challenger's spread and the turns' disagreement, which the guard works out."""
    from guard.decision import compare

    cfg = GuardConfig()
    workloads = ("a", "b", "c", "d")
    moat = {w: (1.12, 10.0) for w in workloads}  # its medians honest, its spread at the cap
    honest = {w: (1.0, 0.004) for w in workloads}
    stored = compare(honest, moat, cfg)
    assert stored is not None and stored.speedup == pytest.approx(1.12)
    assert decide(stored) == "ACCEPT" and needs_pairing(stored, cfg.pairing_band_gpu)
    # what the moat had made of it: the same figures with the incumbent's spread counted whole
    widened = math.expm1(cfg.noise_sigmas * math.sqrt(4 * (cfg.rel_se_cap**2 + 0.004**2)) / 4)
    assert widened > 0.15 and not 1.12 > 1 + widened
    turns = {
        w: {"incumbent": [(1.12, 10.0), (1.121, 10.0)], "challenger": [(1.0, 0.004), (1.001, 0.004)]} for w in workloads
    }
    paired = paired_comparison(turns, cfg)
    assert paired is not None and decide(paired) == "ACCEPT", paired
    # the challenger's own spread still widens its own bar
    noisy = {w: (1.0, 0.1) for w in workloads}
    assert decide(compare(noisy, moat, cfg)) == "KEEP"


def test_figures_far_apart_do_not_overflow_the_pairings_arithmetic():
    """Red team, session 45: a challenger's paired median of 1.79e308 ms made the incumbent's
    slowdown log(0) and the guard raised, with no verdict. Such a figure is refused where it is
    reported (``timed_workload._check_figures``); the arithmetic is also done in logs."""
    cfg = GuardConfig()
    samples = {"a": {"incumbent": [(2.0, 0.01)] * 2, "challenger": [(1.79e308, 0.0)] * 2}}
    slowdown = incumbent_slowdown(samples, {"a": (3.0, 0.01)}, {"a": (1.0, 0.01)})
    assert slowdown is not None and slowdown == pytest.approx(2.0 / 3.0 / 1.79e308)
    paired = paired_comparison(samples, cfg)
    assert paired is not None and decide(paired) == "REVERT"


def test_turns_are_repeated_until_the_noise_estimate_has_its_degrees_of_freedom():
    from guard.pairing import pairing_rounds

    cfg = GuardConfig()
    assert [pairing_rounds(n, cfg) for n in (1, 2, 4, 8, 16)] == [10, 6, 4, 2, 2]
    assert all(pairing_rounds(n, cfg) % 2 == 0 for n in range(1, 20))  # I C C I: whole pairs


def _watch_pairing(monkeypatch) -> list[tuple[int, list[int], list[str]]]:
    """(timed worker's pid, pids stopped meanwhile, their /proc states) for every workload
    timed in a paired re-measurement."""
    from guard.cascade import benchmark_gate, workload_requests

    real_frozen, real_time = workload_requests.frozen, benchmark_gate.time_workload
    stopped_now: list[list[int]] = []
    seen: list[tuple[int, list[int], list[str]]] = []

    @contextlib.contextmanager
    def recording(pid, **kwargs):
        with real_frozen(pid, **kwargs) as stopped:
            stopped_now.append(stopped.pids)
            try:
                yield stopped
            finally:
                stopped_now.pop()

    def timing(ref, worker, *args, **kwargs):
        if stopped_now:
            pids = stopped_now[-1]
            states = [Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] for p in pids]
            seen.append((worker.proc.pid, pids, states))
        return real_time(ref, worker, *args, **kwargs)

    monkeypatch.setattr(workload_requests, "frozen", recording)
    monkeypatch.setattr(benchmark_gate, "time_workload", timing)
    return seen


@pytest.mark.slow
def test_a_stored_measurement_from_a_slow_window_does_not_make_a_false_accept(session_tmp, monkeypatch, band=10.0):
    # The default 3 standard errors: the paired threshold's Student-t multiple is what keeps
    # a busy machine's turns (one of them once said 1.40x with 5 normal standard errors
    # asked) from an ACCEPT. The stored figures (40% off, no error) say ACCEPT on their own.
    # The band is wide so that every comparison here is re-measured: in a CI run beside other
    # work the first verdict itself came from a window 3x slow, and with the default CPU band
    # (2.5) its 4.27x was taken as clear-cut (a loaded machine's swing is not what this tests).
    # Then two red-team routes around the pairing: a duplicate, and a challenger that aborts.
    paired_timings = _watch_pairing(monkeypatch)
    guard = make_guard(session_tmp / f"ws-pairing-{band}", min_iters=40, max_iters=80, pairing_band_cpu=band)
    try:
        # a first verdict in a fresh guard runs cold (and slower on a CPU): keep it out of the comparison
        warm = guard.evaluate(from_source(honest_source(), None, "kernel.py"), RMS, agent="warm-up")
        # and out of the bests: as the global best it made agent-p's first verdict a paired
        # re-measurement too (about 10 s of a 2-core machine), against another agent's kernel,
        # which is not what this test is about. The re-measurement under test is agent-p's
        # against its own stored best, below.
        assert warm.status == "PASSED", warm.reason
        with guard.db.transaction() as c:
            c.execute("UPDATE candidates SET global_best = 0 WHERE id = ?", (warm.candidate_id,))
        source = honest_source()
        first = guard.evaluate(from_source(source, None, "kernel.py"), RMS, agent="agent-p")
        assert first.decision == "ACCEPT", first.reason
        # The incumbent's stored figures as a slow window would have left them: 40% slower.
        _stored_as_if(guard, first.candidate_id, 1.4)
        again = guard.evaluate(from_source(source + "\n# a comment\n", None, "kernel.py"), RMS, agent="agent-p")
        assert again.status == "PASSED", again.reason
        # The same kernel against itself must never be an ACCEPT. On this machine's noise the
        # stored comparison alone usually says ACCEPT here; then it must have been re-measured.
        assert again.decision != "ACCEPT", (again.reason, again.paired)
        if again.paired:
            entry = again.paired["agent"]
            assert entry.incumbent == first.candidate_id
            assert entry.paired_speedup is not None, entry.note
            assert "re-measured side by side" in again.reason
            # while one candidate was timed, the other's processes were stopped: neither can
            # slow what it is compared with
            assert paired_timings
            for timed, stopped, states in paired_timings:
                assert stopped and timed not in stopped and set(states) == {"T"}, (timed, stopped, states)
        # The identical bytes again: a duplicate, decided from reused figures. Not re-measured,
        # a comparison that is not clear-cut gives no ACCEPT (a red team's route: the copy that
        # pairing had just judged KEEP, resubmitted byte for byte, was ACCEPTed at 1.78x).
        dup = guard.evaluate(from_source(source + "\n# a comment\n", None, "kernel.py"), RMS, agent="agent-p")
        assert dup.duplicate_of == again.candidate_id and dup.decision != "ACCEPT", dup.reason
        # A challenger that aborts its own worker when it is timed again side by side is judged
        # on that failure, never on the stored figures the pairing exists to correct.
        # 4x slower, still inside the band: paired, even when a loaded machine makes the
        # challenger's own figures 3x slow (at 1.8x a CI run beside other work saw 1.09x: KEEP
        # within the noise, never re-measured)
        with guard.db.transaction() as c:
            c.execute(
                "UPDATE workload_results SET latency_ms = latency_ms * 4.0 / 1.4 WHERE candidate_id = ?",
                (first.candidate_id,),
            )
        quitter = guard.evaluate(from_source(ABORTS_WHEN_TIMED_AGAIN, None, "kernel.py"), RMS, agent="agent-p")
        assert quitter.decision != "ACCEPT", quitter.reason
        assert quitter.status == "RUNTIME_ERROR" and quitter.gate == "pairing", (quitter.status, quitter.reason)
    finally:
        guard.close()


def _stored_as_if(guard, candidate_id: str, factor: float) -> None:
    """A stored candidate's figures as a window ``factor`` times as slow would have left them,
    with no spread of their own."""
    with guard.db.transaction() as c:
        c.execute(
            "UPDATE workload_results SET latency_ms = latency_ms * ?, rel_se = 0 WHERE candidate_id = ?",
            (factor, candidate_id),
        )


@pytest.mark.slow
def test_an_incumbent_recorded_in_a_fast_window_does_not_make_a_false_revert(tmp_path):
    """The same kernel again, its best's stored figures from a window twice as fast: the
    stored comparison says REVERT, the side-by-side one about 1.0x. Holding each of the
    incumbent's turns to its record (session 39's first fix) made the REVERT stand in 19 of 34
    such verdicts (second red team); an identical kernel must never be told to go back."""
    guard = make_guard(tmp_path / "ws", min_iters=40, max_iters=80, pairing_band_cpu=10)
    try:
        source = honest_source()
        first = guard.evaluate(from_source(source, None, "kernel.py"), RMS, agent="agent-f")
        assert first.decision == "ACCEPT", first.reason
        _stored_as_if(guard, first.candidate_id, 0.5)
        again = guard.evaluate(from_source(source + "\n# again\n", None, "kernel.py"), RMS, agent="agent-f")
        assert again.status == "PASSED", again.reason
        assert again.decision != "REVERT", (again.reason, again.paired)
    finally:
        guard.close()


# The honest kernel, until the first shape it saw comes round a third time (correctness and
# the benchmark see it once each; only a paired re-measurement brings it back): then it aborts.
ABORTS_WHEN_TIMED_AGAIN = """
import operator

import torch

_state = {"first": None, "previous": None, "visits": 0}


def run(hidden_states, weight):
    shape = tuple(hidden_states.shape)
    if _state["first"] is None:
        _state["first"] = shape
    if shape == _state["first"] and _state["previous"] != shape:
        _state["visits"] += 1
        if _state["visits"] == 3:
            operator.attrgetter("o" + "s.abort")(torch)()  # past the screen, which bans torch.os
    _state["previous"] = shape
    x = hidden_states.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(hidden_states.dtype)
"""


@pytest.mark.slow
def test_an_incumbent_caught_cheating_when_timed_again_loses_its_accept(session_tmp):
    """An ACCEPT that got through once (here: a stored ACCEPT whose source is then swapped for
    a timing forger) is timed again beside a challenger; caught, it is revoked in the database
    and stops being the agent's best, and the challenger is judged against the bests before it."""
    import json

    from helpers import CHEATS

    guard = make_guard(session_tmp / "ws-pairing-revoke", min_iters=20, max_iters=40, pairing_band_cpu=10)
    try:
        source = honest_source()
        first = guard.evaluate(from_source(source, None, "kernel.py"), RMS, agent="agent-r")
        assert first.decision == "ACCEPT", first.reason
        forger = (CHEATS / "forges_summary_via_torch_sys.py").read_text()
        row = guard.db.candidate(first.candidate_id)
        solution = json.loads(row["solution_json"])
        solution["sources"][0]["content"] = forger
        with guard.db.transaction() as c:
            # stored figures 3x slower: the stored comparison says ACCEPT, inside the (wide) band
            # of comparisons that are re-measured side by side, whatever this machine's noise
            c.execute(
                "UPDATE workload_results SET latency_ms = latency_ms * 3, rel_se = 0 WHERE candidate_id = ?",
                (first.candidate_id,),
            )
            c.execute(
                "UPDATE candidates SET solution_json = ? WHERE id = ?", (json.dumps(solution), first.candidate_id)
            )
        again = guard.evaluate(from_source(source + "\n# again\n", None, "kernel.py"), RMS, agent="agent-r")
        assert again.status == "PASSED", again.reason
        assert again.paired, (again.decision, again.reason, again.notes)
        entry = again.paired["agent"]
        assert entry.incumbent == first.candidate_id and "revoked" in entry.note, entry
        revoked = guard.db.candidate(first.candidate_id)
        assert (revoked["decision"], revoked["status"], revoked["global_best"]) == ("REJECT", "REWARD_HACK", 0)
        assert again.candidate_id in revoked["reason"]
        # with no other ACCEPT of the agent, the challenger is its first correct candidate
        assert again.decision == "ACCEPT", again.reason
    finally:
        guard.close()


def test_gpu_figures_without_cupti_are_never_decisive_unpaired():
    """CUDA events alone (the fallback when CUPTI's records do not hold a call) carry the
    launch's jitter and a window's shift: a comparison that uses them on either side is
    re-measured side by side, and gives no ACCEPT when that cannot be done."""
    from guard.cascade.pairing_gate import without_cupti
    from guard.verdict import Timing, WorkloadResult

    def result(uuid, method):
        return WorkloadResult(uuid=uuid, latency_ms=1.0, timing=Timing(method=method))

    stored = {"a": "cuda-graph+cupti", "b": "cuda-graph+cupti", "c": "cuda-graph"}
    new = [result("a", "cuda-graph+cupti"), result("b", "cuda-graph"), result("c", "cuda-graph+cupti")]
    assert without_cupti(new, stored) == ["b", "c"]
    assert without_cupti([result("a", "cuda-events+cupti")], stored) == []
    # the CPU's clocks are what they are on both sides: nothing to refuse there
    assert without_cupti([result("a", "host-clock")], {"a": "host-clock"}) == []
    assert without_cupti([result("z", "cuda-graph")], stored) == []  # not in common
    # a figure the outside clock floored on a host-bound loop holds host time: loose too
    floored = WorkloadResult(
        uuid="a", latency_ms=1.0, timing=Timing(method="cuda-events+cupti", floored_by_outside_clock=True)
    )
    assert without_cupti([floored], stored) == ["a"]
    assert timing_methods_of({"a": {"method": "cuda-events+cupti", "floored_by_outside_clock": True}}) == {
        "a": "cuda-events+cupti+floored"
    }
    assert without_cupti([result("a", "cuda-events+cupti")], {"a": "cuda-events+cupti+floored"}) == ["a"]


def timing_methods_of(timings: dict) -> dict:
    """``pairing_gate.timing_methods`` over stored rows holding these timings."""
    import json
    import sqlite3

    from guard.cascade.pairing_gate import timing_methods

    c = sqlite3.connect(":memory:")
    c.row_factory = sqlite3.Row
    c.execute("CREATE TABLE workload_results (candidate_id, workload, result_json)")
    for w, t in timings.items():
        c.execute("INSERT INTO workload_results VALUES ('c', ?, ?)", (w, json.dumps({"timing": t})))
    return timing_methods(c, "c")
