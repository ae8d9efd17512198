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

Taking each window's CPU time (session 33) left the caches: a trusted worker stopped and
continued every few milliseconds, beside a busy neighbour, ran its loop's draws a tenth to two
thirds slower in CPU time, and those draws cost 3-6x the call; in a CI run the forged median
decided at a tenth of the honest figure on the smallest workload. Since session 34 no draw is
in a CPU window (``runner/staged.py``): the trusted loop costs next to nothing to subtract.
"""

from __future__ import annotations

from guard.candidates.load import from_source
from guard.cascade import paced_calls

from helpers import REPO, RMS, SHRINKS_ITS_MEDIANS, Staller, honest_source, unique

STOP_S, RUN_S = 0.02, 0.004  # the trusted worker runs a sixth of the time while its window is open


def test_stalls_of_the_guards_own_loop_do_not_let_a_forged_median_decide(guard_runtime_only, monkeypatch):
    g = guard_runtime_only
    honest = g.evaluate(from_source(unique(honest_source()), None, "kernel.py"), RMS, agent="honest-stalls")
    assert honest.status == "PASSED", honest.reason
    stalled = 0
    real_run = paced_calls.run

    def run(worker, *args, **kwargs):  # a CPU window's calls, paced (``runner/pacing.py``)
        nonlocal stalled
        if worker.role != "trusted":
            return real_run(worker, *args, **kwargs)
        stalled += 1
        with Staller(worker.proc.pid, STOP_S, RUN_S):
            return real_run(worker, *args, **kwargs)

    monkeypatch.setattr(paced_calls, "run", run)
    v = g.evaluate(from_source(unique(SHRINKS_ITS_MEDIANS), None, "kernel.py"), RMS, agent="shrinker-stalled")
    assert stalled >= len(v.workloads), stalled  # every trusted window was stalled
    assert v.status == "PASSED", v.reason
    own = {w.uuid: w.latency_ms for w in honest.workloads}
    for w in v.workloads:
        # the forged median is a hundredth of the call; the decided figure is the guard's own
        assert w.latency_ms >= own[w.uuid] / 4, (w.uuid, w.latency_ms, own[w.uuid], w.timing.outside_clock)


CEILING_PROBE = """
import os, signal, subprocess, sys, time
import torch
from guard.runner.ceilings import _time

torch.set_num_threads(1)  # as in a worker: a pool's spinning threads would count as work
src = torch.randn(1 << 22)
dst = torch.empty_like(src)


def copy():
    for _ in range(20):
        dst.copy_(src)


costs = []
for _ in range(3):
    c0 = time.process_time()
    copy()
    costs.append(time.process_time() - c0)
me = os.getpid()
stall = sys.argv[1].replace("PID", str(me))
staller = subprocess.Popen([sys.executable, "-c", stall], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert staller.stdout.readline().strip() == "go"
stalled = _time(copy, 5, torch.device("cpu"))
# asked to end, not killed: killed, its last SIGSTOP could come after and leave this process
# stopped for good (a fresh clone's suite sat 5 minutes so, session 37); it ends after a SIGCONT
staller.stdin.write("end\\n")
staller.stdin.flush()
staller.wait()
print(stalled, min(costs))
"""


def test_a_ceiling_measured_through_stalls_is_the_machines_own():
    """The CPU's ceilings are cached for every later run: one measured while the machine's
    other work held the core (here: the measuring process stopped for five sixths of the
    time, a wall six times the work) must still be about what the core does. Measured in a
    process of its own, as the trusted worker measures: the test process's other threads
    would count in its CPU time."""
    import subprocess
    import sys

    stall = (  # stops and continues the probe until asked to end on its stdin (or the probe is gone)
        "import os, select, signal, sys, time\nprint('go', flush=True)\n"
        "while not select.select([sys.stdin], [], [], 0)[0]:\n"
        f"    os.kill(PID, signal.SIGSTOP)\n    time.sleep({STOP_S})\n"
        f"    os.kill(PID, signal.SIGCONT)\n    time.sleep({RUN_S})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", CEILING_PROBE, stall], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    stalled, cost = (float(x) for x in done.stdout.split()[-2:])
    assert stalled <= 3 * cost, (stalled, cost)
