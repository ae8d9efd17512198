"""Agents confined away from the workspace (``launcher.confine``): what a confined command sees
of the workspace, of other processes, and whether a client's own sandbox still starts inside."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import confine

CONFINEMENT = confine.probe()
pytestmark = pytest.mark.skipif(CONFINEMENT.binary is None, reason=CONFINEMENT.line)


def _workspace(tmp_path: Path) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    own = ws / "runs" / "r1" / "agents" / "a1" / "worktree"
    own.mkdir(parents=True)
    (ws / "secret.key").write_text("SECRET-KEY\n")
    (ws / "heldout").mkdir()
    (ws / "heldout" / "p.jsonl").write_text("HELD-OUT\n")
    (own.parent / "agent.log").write_text("")  # the launcher's, beside the clone
    (own / "kernel.py").write_text("OWN = 1\n")
    return ws, own


def _confined(ws: Path, own: Path, script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = confine.command(CONFINEMENT.binary, [*argv, "sh", "-c", script], ws, [own])
    return subprocess.run(cmd, cwd=own, capture_output=True, text=True, timeout=120)


@pytest.fixture
def outside_tmp():
    """A folder outside /tmp (a confined agent's /tmp is its own, so what lies under the host's
    would be hidden whatever the rest of the confinement did)."""
    import shutil

    folder = Path.home() / ".cache" / "kernelarc-tests" / f"confine-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_confined_agent_sees_its_own_folder_and_nothing_else_of_the_workspace(outside_tmp):
    # outside /tmp: the agent's /tmp is its own, which would hide a workspace there whatever
    # else the confinement did
    ws, own = _workspace(outside_tmp)
    assert "SECRET-KEY" in subprocess.run(["cat", str(ws / "secret.key")], capture_output=True, text=True).stdout
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={"TOKEN": "ka_sibling"})
    try:
        done = _confined(
            ws,
            own,
            f"cat {ws}/secret.key; grep -r . {ws}; cat {ws}/heldout/p.jsonl; cat /proc/{sibling.pid}/environ;"
            f" umount {ws}; cat {own}/kernel.py; echo written > {own}/out.txt; ls /proc | grep -c '^[0-9]'",
        )
    finally:
        sibling.kill()
        sibling.wait()
    out = done.stdout + done.stderr
    assert "SECRET-KEY" not in out and "HELD-OUT" not in out and "ka_sibling" not in out, out
    assert "OWN = 1" in done.stdout and (own / "out.txt").read_text() == "written\n"
    assert int(done.stdout.split()[-1]) < 10  # its own processes only: sh, grep, ls...
    assert (ws / "secret.key").read_text() == "SECRET-KEY\n"  # the unmount was refused


def test_a_confined_agent_writes_nothing_that_runs_or_is_read_unconfined(outside_tmp, monkeypatch):
    """The first confinement bound the host read-write and the agent's whole folder (red team,
    session 42): the agent linked its log, which the launcher opens at each restart, to the
    secret; wrote the project's code and the guard's caches, run or read unconfined later; set
    a git hook in the user's configuration; took the guard's timing-slot lock in /tmp; and read
    another workspace's secret. Now only its clone (and its HOME) is writable, /tmp is its own,
    and every workspace the guard knows of is hidden."""
    ws, own = _workspace(outside_tmp)
    other = outside_tmp / "other-ws"
    other.mkdir()
    (other / "secret.key").write_text("OTHER-SECRET\n")
    monkeypatch.setenv("KERNELARC_WORKSPACE", str(other))  # a workspace the guard knows of
    code = outside_tmp / "project.py"
    code.write_text("SAFE = 1\n")
    marker = Path("/tmp") / f"kernelarc-confine-test-{os.getpid()}"
    done = _confined(
        ws,
        own,
        f"ln -sf {ws}/secret.key {own.parent}/agent.log; echo bad >> {code}; echo x > {marker};"
        f" cat {other}/secret.key; touch {outside_tmp}/new; echo ok",
    )
    assert done.stdout.strip().endswith("ok"), done.stderr
    assert (own.parent / "agent.log").is_file() and not (own.parent / "agent.log").is_symlink()
    assert code.read_text() == "SAFE = 1\n" and not (outside_tmp / "new").exists()
    assert not marker.exists()  # its /tmp is its own
    assert "OTHER-SECRET" not in done.stdout + done.stderr
    # the same commands, unconfined, do each of these: the test can fail
    monkeypatch.delenv("KERNELARC_WORKSPACE")
    assert "OTHER-SECRET" in subprocess.run(["cat", str(other / "secret.key")], capture_output=True, text=True).stdout


def test_a_folder_outside_the_workspace_cannot_be_made_visible(tmp_path):
    ws, _ = _workspace(tmp_path)
    with pytest.raises(ValueError, match="not inside the workspace"):
        confine.command(CONFINEMENT.binary, ["true"], ws, [tmp_path / "elsewhere"])


@pytest.mark.slow
def test_codex_sandboxes_its_own_commands_inside(tmp_path):
    """Codex runs each command in a bubblewrap sandbox of its own (``--sandbox
    workspace-write``); inside ours, as root, it could not map uid 0 without capabilities and
    every command failed. The agent is not uid 0 in its namespace, and Codex's sandbox starts."""
    from serving.npm import CODEX, npm_bin

    codex = str(npm_bin(CODEX, "codex"))
    ws, own = _workspace(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    cmd = confine.command(
        CONFINEMENT.binary,
        [codex, "sandbox", "-c", "sandbox_mode=workspace-write", "--", "sh", "-c"]
        + [f"cat {ws}/secret.key; cat kernel.py; echo codex > out.txt"],
        ws,
        [own],
    )
    done = subprocess.run(
        cmd, cwd=own, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(home)}
    )
    assert "SECRET-KEY" not in done.stdout + done.stderr
    assert "OWN = 1" in done.stdout, done.stderr[-2000:]
    assert (own / "out.txt").read_text() == "codex\n"


def test_services_of_the_host_are_out_of_reach(tmp_path):
    """A read-only mount does not stop a connect(): a confined agent reached a root-only socket
    on the host and was taken for root there (its uid maps to the launcher's), the way it would
    reach Docker's or systemd's and run anything outside (red team, session 42). The folders
    services listen in are hidden, and their addresses left out of its environment."""
    import socket

    run = Path("/run")
    if not os.access(run, os.W_OK):
        pytest.skip("/run is not writable here: no socket to put there")
    ws, own = _workspace(tmp_path)
    path = run / f"kernelarc-confine-test-{os.getpid()}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    try:
        probe = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(path)!r}); print('CONNECTED')"
        env = confine.environment({**os.environ, "SSH_AUTH_SOCK": str(path), "DBUS_SESSION_BUS_ADDRESS": "unix:x"})
        cmd = confine.command(CONFINEMENT.binary, [sys.executable, "-c", probe], ws, [own])
        done = subprocess.run(cmd, cwd=own, capture_output=True, text=True, timeout=60, env=env)
        assert "CONNECTED" not in done.stdout and "No such file" in done.stderr, done
        assert "SSH_AUTH_SOCK" not in env and "DBUS_SESSION_BUS_ADDRESS" not in env
        unconfined = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        assert "CONNECTED" in unconfined.stdout  # the socket is there: the test can fail
    finally:
        server.close()
        path.unlink()


def test_a_session_id_the_agent_wrote_is_taken_only_if_it_is_an_id(tmp_path):
    """The Claude client reads the session to resume from the agent's log, which the agent
    writes: a list there crashed the launcher (every agent and the server stopped), and a
    string could pose as a flag on the restarted command line."""
    import json

    from launcher.clients.base import AgentContext
    from launcher.clients.claude import ClaudeClient

    ctx = AgentContext("a1", "s", "t", "p", tmp_path, tmp_path, "http://x", "ka_x")
    for sid, taken in (
        (["x"], None),
        ("--dangerously-skip-permissions", None),
        ("a\0b", None),
        ("4f2a-91_c", "4f2a-91_c"),
    ):
        ctx.log.write_text(json.dumps({"type": "system", "session_id": sid}) + "\n")
        assert ClaudeClient().session_id(ctx) == taken, sid


def test_a_client_that_lies_under_tmp_still_starts(tmp_path):
    """The agent's /tmp is its own, which hid what lay under the host's: a fresh clone in /tmp
    (its interpreter, the project, the scripted agent) and a client installed there. Those are
    shown again, read-only; the rest of the host's /tmp stays hidden."""
    ws, own = _workspace(tmp_path)
    client = tmp_path / "bin" / "client"
    client.parent.mkdir()
    client.write_text("#!/bin/sh\necho CLIENT-RAN\n")
    client.chmod(0o755)
    (tmp_path / "bin" / "beside").write_text("x\n")
    (tmp_path / "elsewhere.txt").write_text("HIDDEN\n")
    cmd = confine.command(CONFINEMENT.binary, [str(client)], ws, [own])
    done = subprocess.run(cmd, cwd=own, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "CLIENT-RAN", done.stderr
    peek = confine.command(CONFINEMENT.binary, ["cat", str(tmp_path / "elsewhere.txt")], ws, [own])
    assert "HIDDEN" not in subprocess.run(peek, capture_output=True, text=True, timeout=60).stdout
