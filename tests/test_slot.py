"""One timing slot per device, held across processes: a submission waits for it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
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


def test_timing_is_not_kept_out_by_shared_holders_that_overlap(tmp_path, monkeypatch):
    """flock serves no one in order: two holders whose shared holds overlap kept an exclusive
    request out for as long as they went on (red team, session 40). With the turnstile it waits
    only for the holds already taken."""
    monkeypatch.setenv("KERNELARC_LOCK_DIR", str(tmp_path))
    until = time.monotonic() + 12.0

    def sharer(offset: float) -> None:
        time.sleep(offset)
        slot = TimingSlot("cpu-test-turnstile")
        while time.monotonic() < until:
            with slot.hold(exclusive=False):
                time.sleep(1.0)

    threads = [threading.Thread(target=sharer, args=(o,), daemon=True) for o in (0.0, 0.5)]
    for t in threads:
        t.start()
    time.sleep(0.8)  # both hold it now, one after the other
    with TimingSlot("cpu-test-turnstile").hold(exclusive=True) as waited:
        # the two holds already taken end within a second; flock alone made it wait out all 12 s
        assert waited < 6.0, f"timing waited {waited:.1f} s for shared holds that kept coming"
    for t in threads:
        t.join(20)
