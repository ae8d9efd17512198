"""A candidate's processes run only while its guard holds the timing slot (red team, session
40: a candidate's build spun 600 processes beside another guard's timing on the same machine,
whose honest kernel then took 8-18x longer to judge and was recorded 1.3-2.5x slower)."""

from __future__ import annotations

import threading
import time

import pytest

from guard.candidates.load import from_source
from guard.runner.freeze import cpu_seconds
from guard.runner.proc_tree import tree
from guard.runner.slot import TimingSlot

from helpers import CHEATS, RMS, make_guard, unique

# an honest RMSNorm whose import leaves a process spinning for the rest of its evaluation
SPINS_FROM_ITS_BUILD = (
    "import os\n\nif os.fork() == 0:\n    while True:\n        pass\n\n" + (CHEATS / "honest_torch.py").read_text()
)


def test_a_candidate_is_stopped_while_its_guard_waits_for_the_timing_slot(tmp_path, monkeypatch):
    """Between its correctness rounds (a shared hold) and its benchmark (an exclusive one) the
    guard lets the slot go, and another guard may time meanwhile: the candidate's tree must
    use no CPU time then. The wait is made one second long, as if another guard held the slot."""
    guard = make_guard(tmp_path / "ws", static_screen=False)
    taken = []
    take = guard.pool.take_candidate
    monkeypatch.setattr(guard.pool, "take_candidate", lambda *a, **k: taken.append(take(*a, **k)) or taken[-1])
    used: list[float] = []
    hold = guard.slot.hold

    def waits_first(exclusive: bool, on_wait=None):
        if exclusive and taken and taken[-1].alive and guard.slot.held() is None:
            pids = tree(taken[-1].proc.pid)
            before = cpu_seconds(pids)
            time.sleep(1.0)
            used.append(cpu_seconds(tree(taken[-1].proc.pid)) - before)
        return hold(exclusive, on_wait)

    monkeypatch.setattr(guard.slot, "hold", waits_first)
    try:
        v = guard.evaluate(from_source(unique(SPINS_FROM_ITS_BUILD), "pytorch"), RMS, agent="spinner")
    finally:
        guard.close()
    assert used, f"the guard never waited for the exclusive hold with a live candidate: {v.status} {v.reason}"
    assert v.status == "PASSED", v.reason  # stopped, its spinner did not run: no accusation
    assert used[0] < 0.1, f"the candidate's processes used {used[0]:.2f} s of CPU while its guard waited"


def test_the_build_waits_for_another_guards_timing(tmp_path):
    """No candidate code runs while another process holds the slot exclusively: the build
    takes a shared hold first (it used to run outside any hold)."""
    guard = make_guard(tmp_path / "ws", static_screen=False)
    # the baselines first, so that what waits below is the candidate's own part
    guard.evaluate(from_source(unique((CHEATS / "honest_torch.py").read_text()), "pytorch"), RMS)
    stages: list[str] = []
    done = threading.Event()
    result = {}

    def submit() -> None:
        def progress(stage: str, *_: object) -> None:
            stages.append(stage)

        try:
            result["v"] = guard.evaluate(from_source(unique(SPINS_FROM_ITS_BUILD), "pytorch"), RMS, progress=progress)
        finally:
            done.set()

    other = TimingSlot("another-guard")
    other.path = guard.slot.path  # the same device's slot, as another process would take it
    try:
        with other.hold(exclusive=True):  # another guard times
            t = threading.Thread(target=submit, daemon=True)
            t.start()
            deadline = time.monotonic() + 120
            while "wait" not in stages:
                assert not done.is_set(), f"judged while another process held the slot: {stages}"
                assert time.monotonic() < deadline, f"it never waited: {stages}"
                time.sleep(0.05)
            time.sleep(0.5)
            assert "build" not in stages, stages
        assert done.wait(240)
    finally:
        guard.close()
    assert result["v"].status == "PASSED", result["v"].reason


@pytest.mark.parametrize("first", [False, True])
def test_a_hold_within_a_hold_takes_nothing_more(tmp_path, monkeypatch, first):
    monkeypatch.setenv("KERNELARC_LOCK_DIR", str(tmp_path))
    slot = TimingSlot("cpu-test-reentrant")
    with slot.hold(exclusive=True):
        with slot.hold(exclusive=first) as waited:  # a second descriptor's lock would wait forever
            assert waited == 0.0 and slot.held() == "exclusive"
    assert slot.held() is None
    with slot.hold(exclusive=False):
        with pytest.raises(RuntimeError, match="let it go"):
            with slot.hold(exclusive=True):
                pass
