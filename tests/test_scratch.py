"""A guard's scratch folder (``guard.runner.scratch``): removed when the guard closes, is
collected or its interpreter exits, and, when its process was killed outright, by the next
guard. Test runs and killed servers had left about a hundred such folders in /dev/shm."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

from guard.runner.scratch import LOCK_NAME, Scratch, sweep

MAKE = (
    "import sys; from pathlib import Path; from guard.runner.scratch import Scratch; "
    "s = Scratch(Path(sys.argv[1])); print(s.path, flush=True); "
)


def _in_child(where: Path, then: str) -> tuple[Path, int]:
    """A scratch folder made by another Python process, which then runs ``then``."""
    proc = subprocess.run([sys.executable, "-c", MAKE + then, str(where)], capture_output=True, text=True, timeout=60)
    return Path(proc.stdout.strip()), proc.returncode


def test_a_guard_killed_outright_leaves_its_folder_to_the_next_guard(tmp_path):
    left, rc = _in_child(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert rc == -signal.SIGKILL and left.is_dir() and left.name.startswith("kernelarc-")
    (left / "out.bin").write_bytes(b"x" * 1024)
    mine = Scratch(tmp_path)  # the next guard sweeps before it makes its own
    assert not left.exists() and mine.path.is_dir()
    mine.remove()
    assert not mine.path.exists()


def test_an_interpreter_that_exits_without_a_close_removes_its_folder(tmp_path):
    left, rc = _in_child(tmp_path, "pass")
    assert rc == 0 and left.name.startswith("kernelarc-") and not left.exists()


def test_a_collected_scratch_is_removed(tmp_path):
    s = Scratch(tmp_path)
    path = s.path
    del s
    gc.collect()
    assert not path.exists()


def test_the_sweep_goes_by_the_lock_not_the_pid(tmp_path):
    """A folder is its guard's while the guard holds its lock: a guard in another PID
    namespace (a container sharing /dev/shm) has a PID that means nothing here, and a
    name's number may be anything (a huge one once made every later guard fail to start)."""
    mine = Scratch(tmp_path)  # alive, locked by this process
    abandoned = tmp_path / "kernelarc-1-abandoned"  # a lock file nobody holds
    abandoned.mkdir()
    (abandoned / LOCK_NAME).touch()
    # locked by another process whose PID, as written, is dead
    elsewhere = tmp_path / f"kernelarc-{2**22 + 17}-elsewhere"
    elsewhere.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
            str(elsewhere / LOCK_NAME),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        fresh = tmp_path / "kernelarc-5-fresh"  # made, not locked yet: a guard starting
        fresh.mkdir()
        stale = tmp_path / "kernelarc-6-stale"  # a guard from before locks, long gone
        stale.mkdir()
        os.utime(stale, (0, 0))
        huge = tmp_path / "kernelarc-99999999999999999999-x"
        huge.write_text("a file, not a folder")
        other = tmp_path / "kernelarc-probe-x"  # not a guard's folder
        other.mkdir()
        assert sorted(sweep(tmp_path)) == sorted([abandoned, stale])
        assert mine.path.is_dir() and elsewhere.is_dir() and fresh.is_dir() and huge.is_file() and other.is_dir()
    finally:
        holder.kill()
        holder.wait()
    assert sweep(tmp_path) == [elsewhere]  # its holder is gone
    mine.remove()
