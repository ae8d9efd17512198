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
    """The submission says that it waits, and is still waiting, while another process holds
    the slot; once it is released, the submission is judged. No clock: the test waits for
    the submission's own words, however long a loaded machine takes to get there."""
    ws = fast_workspace(tmp_path / "ws", correctness_rounds=1)
    slot = TimingSlot(resolve("cpu").key)
    err_path = tmp_path / "submit.err"
    with slot.hold(exclusive=True), open(err_path, "w") as err_file:
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
            stderr=err_file,
            text=True,
        )
        try:
            deadline = time.monotonic() + 240
            while "waiting for the timing slot" not in err_path.read_text():
                assert proc.poll() is None, f"the submission ended without waiting: {err_path.read_text()[-2000:]}"
                assert time.monotonic() < deadline, f"it never said that it waits: {err_path.read_text()[-2000:]}"
                time.sleep(0.2)
            time.sleep(1.0)  # it keeps waiting: nothing else can let it through while the slot is held
            assert proc.poll() is None, "the submission finished while another process held the slot"
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, err_path.read_text()[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["status"] == "PASSED"


def test_shared_holders_do_not_block_each_other(tmp_path):
    slot = TimingSlot("cpu-test-shared")
    waits = []
    with slot.hold(exclusive=False):
        # a second shared holder takes the slot at once: it never reports a wait (were it to
        # block, it would wait for the first, which this thread holds, and the test would hang)
        with TimingSlot("cpu-test-shared").hold(exclusive=False, on_wait=lambda: waits.append(1)):
            assert waits == []
