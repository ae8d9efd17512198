"""The demo's own workspace and quick CPU profile (the demo itself is timed by hand: see the
closing notes and docs; it needs minutes, not a unit test)."""

from __future__ import annotations

import json

from guard.config import GuardConfig
from guard.workspace import Workspace
from kernelarc_mcp.commands.demo import DEMO_CPU_PROFILE, demo_workspace, ensure_cpu_profile


def test_demo_has_a_workspace_of_its_own(monkeypatch, tmp_path):
    monkeypatch.delenv("KERNELARC_DEMO_WORKSPACE", raising=False)
    monkeypatch.setenv("KERNELARC_WORKSPACE", str(tmp_path / "real"))
    assert demo_workspace(None).name == ".kernelarc-demo"  # never the user's real workspace
    assert demo_workspace(str(tmp_path / "mine")) == tmp_path / "mine"


def test_quick_profile_is_written_once_and_never_over_a_users_config(tmp_path):
    ws = Workspace.open(tmp_path / "demo")
    assert ensure_cpu_profile(ws)
    cfg = ws.config()
    assert cfg.compile_baseline is False and cfg.max_iters == DEMO_CPU_PROFILE["max_iters"]
    # every other setting, the defences' included, stays the guard's default
    assert cfg.outside_windows_cpu == GuardConfig().outside_windows_cpu
    assert cfg.replay_checks == GuardConfig().replay_checks
    ws.config_path.write_text(json.dumps({"min_iters": 7}))
    assert not ensure_cpu_profile(ws)
    assert ws.config().min_iters == 7
