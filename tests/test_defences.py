"""Every cheat in tests/cheats is rejected, with the static screen on and with it off."""

from __future__ import annotations

import re

import pytest

from guard.candidates.load import from_source
from guard.problems.derive import workload_set

from helpers import (
    CHEATS,
    RMS,
    cheat_files,
    cheat_source,
    expectation,
    honest_source,
    hung_call_s,
    submit_cheat,
    unique,
)

CHEAT_FILES = cheat_files("cpu")
# cheats that take their worker down (every candidate gets a fresh worker anyway)
FAULTS = {"infinite_loop", "hard_exit", "early_exit", "segfault", "out_of_memory", "leaks_state"}


def evaluate(guard, source: str, problem: str, agent: str):
    return guard.evaluate(from_source(source, None, "kernel.py"), problem, agent=agent)


@pytest.mark.parametrize("path", CHEAT_FILES, ids=lambda p: p.stem)
def test_cheat_with_screen(guard, path):
    exp = expectation(path)
    v = submit_cheat(guard, path, f"cheat-{path.stem}")
    assert v.status == exp["screen"], f"{path.name}: {v.status} {v.reason}\n{v.diagnostic}"
    if exp["screen"] == "PASSED":
        assert v.decision in ("ACCEPT", "KEEP", "REVERT")
        return
    assert v.decision == "REJECT"
    assert v.gate is not None and v.reason
    if v.gate == "screen":
        # the banned construct and its line
        assert re.search(r"kernel\.py:\d+: ", v.reason), v.reason
    if exp["screen"] == "TIMEOUT":
        assert hung_call_s(v) < guard.cfg.call_timeout_s + 15, v.phases_s


@pytest.mark.parametrize("path", CHEAT_FILES, ids=lambda p: p.stem)
def test_cheat_runtime_defence_alone(guard_runtime_only, path):
    exp = expectation(path)
    g = guard_runtime_only
    v = submit_cheat(g, path, f"cheat-{path.stem}")
    assert v.status == exp["runtime"], f"{path.name}: {v.status} {v.reason}\n{v.diagnostic}"
    if exp["runtime"] != "PASSED":
        assert v.decision == "REJECT" and v.gate in ("build", "correctness", "benchmark")
    if exp["heldout"]:
        assert "held-out" in v.reason and "shape not shown" in v.reason
        assert v.first_failing_workload.startswith("held-out")
    if path.stem in FAULTS:
        # The worker died or was killed and was replaced: the next candidate is judged correctly.
        after = evaluate(g, honest_source(), RMS, f"honest-after-{path.stem}")
        assert after.status == "PASSED", after.reason


def test_screen_names_construct_and_line(guard):
    v = evaluate(guard, unique((CHEATS / "patches_torch.py").read_text()), RMS, "lines")
    assert v.gate == "screen" and v.status == "REWARD_HACK"
    assert "kernel.py:5:" in v.reason and "torch.allclose" in v.reason


def test_heldout_shapes_never_shown(guard):
    v = evaluate(guard, cheat_source(CHEATS / "shape_specialised.py", guard), RMS, "specialist")
    assert v.status == "INCORRECT_NUMERICAL"
    hidden = workload_set(guard.store.get(RMS), "cpu", guard._secret).heldout
    text = v.model_dump_json()
    for w in hidden:
        assert f"'num_tokens': {w.axes['num_tokens']}" not in text
        assert f"num_tokens={w.axes['num_tokens']}" not in text
        assert f'"num_tokens": {w.axes["num_tokens"]}' not in text
    assert v.diagnostic is None
