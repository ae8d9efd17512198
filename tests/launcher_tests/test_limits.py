"""What an agent may take of the machine (``launcher.limits``): it runs below the guard's
priority and cannot raise itself, its processes stay in a cgroup it cannot leave, capped in
number (and memory, where asked), and none outlives the agent."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from guard.sandbox import cgroups
from launcher import confine
from launcher.limits import AgentLimits, Limited

CGROUPS = cgroups.probe()
needs_cgroups = pytest.mark.skipif(CGROUPS.base is None, reason=f"no cgroup here: {CGROUPS.reason}")
CONFINEMENT = confine.probe()


def _run(limited: Limited, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(limited.argv, capture_output=True, text=True, timeout=timeout)
    finally:
        limited.close()


def _confined(tmp_path: Path, script: str) -> list[str]:
    """``script`` as a confined agent runs it, where the host allows confinement."""
    if CONFINEMENT.binary is None:
        return ["sh", "-c", script]
    ws = tmp_path / "ws"
    own = ws / "agents" / "a1"
    own.mkdir(parents=True)
    return confine.command(CONFINEMENT.binary, ["sh", "-c", script], ws, [own])


def test_an_agent_runs_below_the_guard_and_cannot_raise_itself(tmp_path):
    # field 19 of /proc/self/stat is the nice value; renice to 0 and to -5 must both fail
    script = (
        "renice -n 0 -p $$ >/dev/null 2>&1; renice -n -5 -p $$ >/dev/null 2>&1;"
        " awk '{print $19}' /proc/self/stat; python3 -c 'import os; os.nice(-10)' 2>&1 | tail -1"
    )
    done = _run(Limited(_confined(tmp_path, script), AgentLimits()))
    lines = done.stdout.split("\n")
    assert lines[0] == str(AgentLimits().nice) == "19", done
    assert "PermissionError" in done.stdout, done


FORKS = """
import os, time
started = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    started += 1
print(started)
"""


@needs_cgroups
@pytest.mark.skipif(CONFINEMENT.binary is None, reason=CONFINEMENT.line)
def test_an_agents_processes_stay_in_its_group_and_are_capped(tmp_path):
    limited = Limited(
        _confined(
            tmp_path,
            # try to leave for the root group (v2 and v1 names), then start far more than the cap
            "grep -c kernelarc- /proc/self/cgroup; for f in /sys/fs/cgroup/cgroup.procs"
            " /sys/fs/cgroup/pids/cgroup.procs; do echo $$ > $f; done 2>/dev/null;"
            f" grep -c kernelarc- /proc/self/cgroup; {sys.executable} -c '{FORKS}'",
        ),
        AgentLimits(tasks=64),
    )
    assert limited.group is not None and "tasks <= 64" in limited.line
    done = _run(limited)
    groups_before, groups_after, started = map(int, done.stdout.split())
    assert groups_after == groups_before >= 1, done  # still in every group it was started in
    assert 0 < started < 64, done  # the cap held: fork failed inside the group


@needs_cgroups
def test_nothing_an_agent_started_outlives_it(tmp_path):
    """A process that left the agent's session and process group is still in its cgroup, and
    ends with it (unconfined here: a confined one would die with its PID namespace anyway)."""
    limited = Limited(["sh", "-c", "setsid sleep 300 > /dev/null 2>&1 & echo $!"], AgentLimits())
    done = subprocess.run(limited.argv, capture_output=True, text=True, timeout=30)
    orphan = int(done.stdout.split()[-1])
    assert Path(f"/proc/{orphan}").exists()  # it outlived the agent's own process
    limited.close()
    for _ in range(50):
        if not Path(f"/proc/{orphan}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{orphan}").exists()


@pytest.mark.skipif(CGROUPS.memory_base is None, reason="no memory cgroup here")
def test_an_agents_memory_is_capped_where_asked(tmp_path):
    limited = Limited(
        [sys.executable, "-c", "b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); print('held')"],
        AgentLimits(memory_gb=0.125),
    )
    assert "memory <= 0.125 GB" in limited.line
    done = _run(limited)
    assert "held" not in done.stdout and done.returncode != 0, done


def test_the_launch_options_become_the_agents_limits():
    """``--agent-tasks`` reaches the limits (it had no option), and a value out of range is
    refused in words that name its option."""
    from kernelarc_mcp.cli import build_parser
    from kernelarc_mcp.commands.swarm import agent_limits

    parser = build_parser()
    args = parser.parse_args(["launch", "--problem", "p", "--agent-tasks", "200", "--agent-nice", "10"])
    assert agent_limits(args) == AgentLimits(nice=10, tasks=200)
    assert agent_limits(parser.parse_args(["launch", "--problem", "p"])) == AgentLimits()
    for option, value in (("--agent-tasks", "10"), ("--agent-nice", "25"), ("--agent-memory-gb", "0")):
        with pytest.raises(ValueError, match=f"^{option}: "):
            agent_limits(parser.parse_args(["launch", "--problem", "p", option, value]))
