"""A busy machine that stalls the guard's own loop cannot let a forged CPU median decide.

On the CPU the decided figure is floored by the outside clock: the candidate's charged window
less the trusted worker's loop without the call. A stall of the trusted window (the machine's
other work holding its core) lengthened that loop and so shortened the outside figure, by as
much as the whole call: a median forged 1000x short was PASSED with figures 13x and 58x below
the honest kernel's (red team, session 32). Here the trusted worker is stopped for most of
every one of its windows, as an overloaded machine would hold it, while a candidate that
divides its own medians by 100 is judged: its decided figures must stay near the honest
kernel's. The stalls are made with SIGSTOP, so they take wall time and no CPU time, as a
descheduled process's do.
"""

from __future__ import annotations

import os
import signal
import threading

from guard.candidates.load import from_source
from guard.cascade import outside_windows
from guard.runner import messages as m

from helpers import RMS, SHRINKS_ITS_MEDIANS, honest_source, unique

STOP_S, RUN_S = 0.02, 0.004  # the trusted worker runs a sixth of the time while its window is open


class Staller:
    """While started: stops and resumes ``pid`` in turn."""

    def __init__(self, pid: int) -> None:
        self.pid, self.done = pid, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self.done.wait(STOP_S)
            os.kill(self.pid, signal.SIGCONT)
            self.done.wait(RUN_S)

    def __enter__(self) -> Staller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()
        os.kill(self.pid, signal.SIGCONT)


def test_stalls_of_the_guards_own_loop_do_not_let_a_forged_median_decide(guard_runtime_only, monkeypatch):
    g = guard_runtime_only
    honest = g.evaluate(from_source(unique(honest_source()), None, "kernel.py"), RMS, agent="honest-stalls")
    assert honest.status == "PASSED", honest.reason
    stalled = 0
    real_call = outside_windows.call

    def call(worker, message, reply_type, timeout):
        nonlocal stalled
        if not isinstance(message, m.Overhead):
            return real_call(worker, message, reply_type, timeout)
        stalled += 1
        with Staller(worker.proc.pid):
            return real_call(worker, message, reply_type, timeout)

    monkeypatch.setattr(outside_windows, "call", call)
    v = g.evaluate(from_source(unique(SHRINKS_ITS_MEDIANS), None, "kernel.py"), RMS, agent="shrinker-stalled")
    assert stalled >= len(v.workloads), stalled  # every trusted window was stalled
    assert v.status == "PASSED", v.reason
    own = {w.uuid: w.latency_ms for w in honest.workloads}
    for w in v.workloads:
        # the forged median is a hundredth of the call; the decided figure is the guard's own
        assert w.latency_ms >= own[w.uuid] / 4, (w.uuid, w.latency_ms, own[w.uuid], w.timing.outside_clock)
