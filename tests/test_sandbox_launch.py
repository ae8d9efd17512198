"""``guard.sandbox.launch``: a sandboxed command with its descriptors and groups, none of
which outlives a start that fails, and which the child inherits when it starts."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from guard import sandbox
from guard.sandbox import launch as launch_mod
from guard.sandbox.policy import SandboxPolicy


def writers_gone(read_end: int) -> bool:
    """Whether every write end of ``read_end``'s pipe is closed: a read then ends at once."""
    ready, _, _ = select.select([read_end], [], [], 5)
    return bool(ready) and os.read(read_end, 1 << 16) == b""


def policy_for(tmp_path: Path) -> tuple[SandboxPolicy, dict[str, str]]:
    env = {"PATH": os.defpath}
    return SandboxPolicy.for_worker(tmp_path, "cpu", env=env), env


def test_a_failed_wrap_leaves_no_descriptor_open(tmp_path, monkeypatch, made_here):
    """The pipes it made and the caller's descriptor it was handed are closed when a step
    fails (before, ``kernelarc verify`` leaked its result pipe when ``wrap`` raised)."""
    policy, env = policy_for(tmp_path)

    def fails(*args, **kwargs):
        raise FileNotFoundError("bwrap not found")

    monkeypatch.setattr(launch_mod, "wrap", fails)
    handed_r, handed_w = os.pipe()
    made_here.ends.clear()  # the caller's pipe is not prepare's
    with pytest.raises(FileNotFoundError):
        launch_mod.prepare(policy, ["true"], env, tag="t", tasks_limit=8, hand_over=[handed_w], want_info=True)
    assert made_here.ends, "prepare made no pipe before wrap: the test no longer tests a release"
    assert made_here.still_open() == []
    assert writers_gone(handed_r)
    os.close(handed_r)


def test_a_failed_start_releases_its_groups_and_pipes(tmp_path, monkeypatch, made_here):
    """``abandon`` closes the info pipe, the child's ends and removes the groups."""
    policy, env = policy_for(tmp_path)
    closed: list[str] = []

    class Group:
        memory_path = None

        def enter(self, argv):
            return ["in-group", *argv]

        def close(self):
            closed.append("group")

    monkeypatch.setattr(sandbox.cgroups.SandboxGroup, "make", classmethod(lambda cls, *a, **k: Group()))
    monkeypatch.setattr(launch_mod, "wrap", lambda policy, argv, env, **kw: ["wrapped", *argv])
    launch = launch_mod.prepare(policy, ["true"], env, tag="t", tasks_limit=8, want_info=True)
    assert launch.cmd[:2] == ["in-group", "wrapped"]
    assert launch.info_r is not None and launch.pass_fds
    assert set(made_here.still_open()) >= {launch.info_r, *launch.pass_fds}
    launch.abandon()
    launch.abandon()  # again: the group is not closed twice (the list below), no error
    assert made_here.still_open() == []
    assert closed == ["group"] and launch.group is None and launch.info_r is None


def test_the_child_inherits_the_handed_descriptor(tmp_path, needs_bwrap):
    """A real sandboxed child writes to the descriptor it was handed, under the filter; this
    process keeps none of the child's ends once it started."""
    policy, env = policy_for(tmp_path)
    read_end, write_end = os.pipe()
    code = f"import os; os.write({write_end}, b'from inside'); os.close({write_end})"
    launch = sandbox.launch.prepare(
        policy, [sys.executable, "-c", code], env, tag="launch-test", tasks_limit=16, hand_over=[write_end]
    )
    try:
        proc = subprocess.run(launch.cmd, pass_fds=launch.pass_fds, env=env, capture_output=True, timeout=30)
    finally:
        launch.started()
        if launch.group is not None:
            launch.group.close()
    assert proc.returncode == 0, proc.stderr
    ready, _, _ = select.select([read_end], [], [], 5)
    assert ready and os.read(read_end, 100) == b"from inside"
    assert writers_gone(read_end)  # the child's copy went with it, and this process's is closed
    os.close(read_end)


@pytest.mark.parametrize("fails_at", ["prepare", "log", "spawn"])
def test_a_worker_that_fails_to_start_leaves_nothing_open(tmp_path, monkeypatch, needs_bwrap, fails_at, made_here):
    """No pipe or cgroup of a candidate worker's start outlives a start that fails: in the
    sandbox's preparation, in opening its log, or in the spawn (review, session 44: the log's
    open sat between the first and the last, outside the cleanup, and left the info and
    filter pipes and the cgroup)."""
    from guard.runner import process as process_mod
    from guard.runner.process import WorkerProcess
    from guard.sandbox import cgroups

    def fails(*args, **kwargs):
        raise OSError(24, "Too many open files")

    if fails_at == "prepare":
        monkeypatch.setattr(launch_mod, "wrap", fails)
    else:
        monkeypatch.setattr(process_mod.spawner, "popen", fails)
    found = cgroups.probe()
    groups_before = set(found.base.iterdir()) if found.base is not None else set()
    worker = WorkerProcess("candidate", "cpu", tmp_path / "w")
    if fails_at == "log":
        monkeypatch.setattr(worker, "_log", fails)
    else:
        worker._log()  # the log is the worker's own, kept for its tail: opened before the count
    made_here.ends.clear()
    with pytest.raises(OSError, match="Too many open files"):
        worker.start()
    if fails_at != "log":  # the log opens first now: a start that fails there made nothing yet
        assert made_here.ends, "the start made no descriptor: the test no longer tests a release"
    assert made_here.still_open() == []
    if found.base is not None:
        assert set(found.base.iterdir()) <= groups_before
    assert worker.sock is None and worker.cgroup_dir is None
