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

from guard.runner.scratch import Scratch, sweep

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


def test_the_sweep_keeps_live_guards_and_what_is_not_a_guards(tmp_path):
    dead_pid = 2**22 + 17  # above the largest PID Linux allows: no process has it
    live = tmp_path / f"kernelarc-{os.getpid()}-live"
    dead = tmp_path / f"kernelarc-{dead_pid}-dead"
    other = tmp_path / "kernelarc-probe-x"  # not a guard's (no PID in its name)
    plain = tmp_path / f"kernelarc-{dead_pid}-file"  # a file, not a folder
    for d in (live, dead, other):
        d.mkdir()
    plain.write_text("x")
    assert sweep(tmp_path) == [dead]
    assert live.is_dir() and other.is_dir() and plain.is_file() and not dead.exists()
