"""A problem too large for the device is refused with the figures before any work, and each
verdict reports its workers' peak memory."""

from __future__ import annotations

import pytest

from guard.candidates.load import from_source
from guard.cascade import GuardError
from guard.cascade.memory_plan import PeakWatch, does_not_fit, tensor_bytes, workload_need
from guard.problems.schema import Definition, Workload
from guard.runner.common import PeakMeter

from helpers import RMS, honest_source, make_guard

BIG = Definition.model_validate(
    {
        "name": "big_copy",
        "op_type": "copy",
        "reference": "def run(x):\n    return x.clone()\n",
        "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n", 4096], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n", 4096], "dtype": "float32"}},
    }
)


def test_the_need_of_a_workload_counts_inputs_outputs_and_sets():
    w = Workload.model_validate({"uuid": "w", "axes": {"n": 1024}, "inputs": {"x": {"type": "random"}}})
    assert tensor_bytes(BIG, w) == (16 << 20, 16 << 20)
    assert workload_need(BIG, w, n_sets=4, flush_bytes=0) == 4 * (16 << 20) + 2 * (16 << 20)


def test_a_timed_loop_holds_fewer_input_sets_the_larger_a_set_is():
    from guard.cascade.memory_plan import LARGE_SET_BYTES, SMALL_SET_BYTES, input_sets

    assert [input_sets(b, "cuda") for b in (1 << 20, SMALL_SET_BYTES, LARGE_SET_BYTES, 8 << 30)] == [4, 2, 1, 1]
    assert [input_sets(b, "cpu") for b in (1 << 20, SMALL_SET_BYTES, LARGE_SET_BYTES)] == [2, 2, 1]
    assert input_sets(300 << 20, "cuda") == 1  # larger than any cache the flush leaves alone


def test_a_problem_that_cannot_fit_is_refused_with_how_much_it_needs_and_has():
    w = Workload.model_validate({"uuid": "huge", "axes": {"n": 1 << 20}, "inputs": {"x": {"type": "random"}}})
    why = does_not_fit(BIG, [w], 8 << 30, "cpu", lambda _: 2, 8 << 20)
    assert why and "huge" in why and "needs about" in why and "8.0 GiB" in why
    small = Workload.model_validate({"uuid": "small", "axes": {"n": 16}, "inputs": {"x": {"type": "random"}}})
    assert does_not_fit(BIG, [small], 8 << 30, "cpu", lambda _: 2, 8 << 20) is None


def test_the_guard_refuses_before_any_work_and_reports_peak_memory(session_tmp):
    tight = make_guard(session_tmp / "ws-memory-tight", cpu_memory_limit_gb=3.005)
    try:
        with pytest.raises(GuardError, match="does not fit this cpu device"):
            tight.evaluate(from_source(honest_source(), None, "kernel.py"), RMS, agent="mem")
    finally:
        tight.close()
    g = make_guard(session_tmp / "ws-memory")
    try:
        v = g.evaluate(from_source(honest_source(), None, "kernel.py"), RMS, agent="mem")
        assert v.status == "PASSED", v.reason
        assert set(v.peak_memory_bytes) == {"trusted", "candidate"}
        assert all(100 << 20 < b < 8 << 30 for b in v.peak_memory_bytes.values()), v.peak_memory_bytes
        # gate by gate, and the whole evaluation's peak is the largest gate's
        gates = v.peak_memory_by_gate
        assert {"build", "correctness", "benchmark"} <= set(gates), gates
        for role in ("trusted", "candidate"):
            assert v.peak_memory_bytes[role] == max(g.get(role, 0) for g in gates.values())
    finally:
        g.close()


def test_peaks_are_read_and_reset_gate_by_gate():
    held = {
        "trusted": [(500, {"baseline": 500}), (40, {"compare": 40, "reference": 30}), (70, {"overhead": 70})],
        "candidate": [(30, {"check": 30}), (90, {"arm": 90, "run": 60})],
    }
    resets = []

    def read(role, reset):
        resets.append((role, reset))
        return held[role].pop(0) if held[role] else None

    watch = PeakWatch(read)
    watch.start("trusted")  # the baselines' 500 is not this evaluation's
    watch.mark("correctness", "trusted", "candidate")
    watch.mark("benchmark", "trusted", "candidate")
    watch.mark("pairing", "candidate")  # a worker that cannot answer adds nothing
    assert watch.by_gate == {
        "correctness": {
            "trusted": 40,
            "trusted.compare": 40,
            "trusted.reference": 30,
            "candidate": 30,
            "candidate.check": 30,
        },
        "benchmark": {"trusted": 70, "trusted.overhead": 70, "candidate": 90, "candidate.arm": 90, "candidate.run": 60},
    }
    assert watch.overall() == {"trusted": 70, "candidate": 90}
    assert all(reset for _, reset in resets)
    assert PeakWatch(lambda role, reset: None).overall() is None


def test_a_worker_measures_each_request_and_forgets_on_reset():
    meter = PeakMeter("cpu")
    meter.before()
    held = bytearray(64 << 20)  # touched: resident
    meter.after("check")
    del held
    meter.before()
    meter.after("stats")
    peak, by_op = meter.read(reset=True)
    assert set(by_op) == {"check", "stats"} and peak == by_op["check"] >= by_op["stats"]
    assert peak > 64 << 20
    now, by_op = meter.read(reset=False)  # the resident set now, no request since
    assert by_op == {} and 0 < now < peak
