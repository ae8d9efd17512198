"""``--shard K/N`` (tests/conftest.py): a GPU run longer than one device call is split over N
calls, each running one part; the parts of a selection must not overlap and must cover it.
``--gpu-workloads N`` fits more of them in a call."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO, RMS, in_shard, shadow_with_fewer_workloads

SELECTION = ["tests/test_poison.py", "tests/test_pacing.py"]


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_parts_cover_every_test_once():
    ids = [f"tests/test_{m}.py::test_{t}[{p}]" for m in "abc" for t in range(20) for p in ("x", "y")]
    parts = [{i for i in ids if in_shard(i, k, 3)} for k in (1, 2, 3)]
    assert set().union(*parts) == set(ids)
    assert sum(len(p) for p in parts) == len(ids)
    assert all(len(p) > len(ids) / 6 for p in parts), [len(p) for p in parts]  # none nearly empty


def test_a_run_with_a_shard_collects_its_part_alone():
    every = _pytest(*SELECTION)
    part = _pytest("--shard", "2/2", *SELECTION)
    assert every.returncode == 0 and part.returncode == 0, part.stdout[-2000:] + part.stderr[-2000:]
    everything = {ln for ln in every.stdout.splitlines() if "::" in ln}
    got = {ln for ln in part.stdout.splitlines() if "::" in ln}
    assert len(everything) >= 8
    assert got == {i for i in everything if in_shard(i, 2, 2)}
    assert "deselected" in part.stdout


def test_a_shard_that_is_no_part_is_refused_with_its_reason():
    done = _pytest("--shard", "4/3", SELECTION[0])
    assert done.returncode == 4, done.returncode  # pytest's usage error
    assert "--shard 4/3" in done.stderr, done.stderr[-500:]


def test_fewer_workloads_shadow_the_shipped_problem_in_one_workspace(tmp_path):
    """``--gpu-workloads N``: the GPU tests' guard judges the RMSNorm cheats on N workloads,
    the smallest, the largest and evenly between; other workspaces keep all of them."""
    from guard.workspace import Workspace

    kept = shadow_with_fewer_workloads(tmp_path / "ws", RMS, 4)
    problem = Workspace.open(tmp_path / "ws").problems().get(RMS)
    assert [w.uuid for w in problem.workloads] == kept and len(kept) == 4
    shipped = Workspace.open(tmp_path / "other").problems().get(RMS)
    assert len(shipped.workloads) == 12 and kept[0] == shipped.workloads[0].uuid
    assert kept[-1] == shipped.workloads[-1].uuid
