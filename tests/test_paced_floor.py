"""The paced window's floor on the CPU cannot be voided by one slow trusted loop.

A paced window's figure (each call's inputs written once the call before it is done, so its
calls cannot be batched) is the candidate's window less the trusted worker's loop without the
call on the same inputs; half of it floors the decided figure (``OutsideClock.floor_ms``).
With one trusted loop, a loop that the machine's other work slowed made an honest paced
figure negative (-0.016 ms, session 36's red team), a floor of nothing under a batcher's
forged median. The trusted loop is now run ``outside_paced_loops_cpu`` times on the window's
inputs and the shortest subtracted. Here the first trusted loop after each paced window is
charged a second more than it ran: every paced figure must still be that of the calls.
"""

from __future__ import annotations

from guard.candidates.load import from_source
from guard.cascade import cpu_windows
from guard.config import GuardConfig

from helpers import FEW_TIMED_CALLS, RMS, honest_source, make_guard, unique

SLOWED_S = 1.0  # a window's calls take milliseconds: one such loop would make its figure negative


def test_one_slow_trusted_loop_does_not_void_the_paced_figure(session_tmp, monkeypatch):
    default = GuardConfig().outside_paced_loops_cpu  # the guard's own, whatever the fast settings say
    g = make_guard(session_tmp / "ws-paced-floor", outside_paced_loops_cpu=default, **FEW_TIMED_CALLS)
    real = cpu_windows.CpuWindows.trusted
    slowed: list[int] = []
    loops_after: dict[int, int] = {}

    def trusted(self, overhead, chosen):
        wall, took, reply = real(self, overhead, chosen)
        if not self.paced:
            return wall, took, reply
        key = id(self.staging)  # the paced window's inputs: its trusted loops share them
        loops_after[key] = loops_after.get(key, 0) + 1
        if loops_after[key] == 1:
            slowed.append(key)
            return wall + SLOWED_S, took + SLOWED_S, reply
        return wall, took, reply

    monkeypatch.setattr(cpu_windows.CpuWindows, "trusted", trusted)
    try:
        v = g.evaluate(from_source(unique(honest_source()), None, "kernel.py"), RMS, agent="paced-floor")
    finally:
        g.close()
    assert v.status == "PASSED", v.reason
    assert len(slowed) >= len(v.workloads), slowed  # every paced window had its first loop slowed
    for w in v.workloads:
        oc = w.timing.outside_clock
        assert oc is not None and oc.paced_ms is not None, w.uuid
        assert oc.paced_loops == default >= 2, (w.uuid, oc.paced_loops)
        # a loop charged a second more would have made the figure about -1 s / calls
        assert oc.paced_ms > 0, (w.uuid, oc.paced_ms, oc.run_iters)
