"""One timing slot per device, held across processes: a submission waits for it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from guard.runner.device import resolve
from guard.runner.slot import TimingSlot

from helpers import CHEATS, REPO, RMS, fast_workspace


def test_submit_waits_for_the_timing_slot(tmp_path):
    ws = fast_workspace(tmp_path / "ws", correctness_rounds=1)
    slot = TimingSlot(resolve("cpu").key)
    with slot.hold(exclusive=True):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelarc_mcp.cli",
                "--workspace",
                str(ws),
                "submit",
                str(CHEATS / "honest_torch.py"),
                "--problem",
                RMS,
                "--device",
                "cpu",
                "--json",
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(15)
        assert proc.poll() is None, "the submission finished while another process held the slot"
        held_until = time.monotonic()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "waiting for the timing slot" in err
    assert json.loads(out.strip().splitlines()[-1])["status"] == "PASSED"
    assert time.monotonic() >= held_until


def test_shared_holders_do_not_block_each_other(tmp_path):
    slot = TimingSlot("cpu-test-shared")
    with slot.hold(exclusive=False):
        t0 = time.monotonic()
        with TimingSlot("cpu-test-shared").hold(exclusive=False) as waited:
            assert waited < 1 and time.monotonic() - t0 < 1
