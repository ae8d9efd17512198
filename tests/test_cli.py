"""The command line as a user runs it: a real subprocess, stdout and stderr separated."""

from __future__ import annotations

import json

from helpers import CHEATS, RMS, SOL_EXAMPLES, fast_workspace, kernelarc


def test_submit_json_and_forged_verdict(tmp_path):
    ws = fast_workspace(tmp_path / "ws")
    proc = kernelarc(ws, "submit", str(CHEATS / "forged_verdict.py"), "--problem", RMS, "--device", "cpu", "--json")
    lines = proc.stdout.strip().splitlines()
    verdict = json.loads(lines[-1])
    for key in ("decision", "status", "reason", "candidate_id", "score", "advice", "workloads"):
        assert key in verdict
    assert verdict["decision"] == "REJECT"
    assert "forged" not in proc.stdout  # what the candidate printed never reaches our stdout
    assert len(lines) == 1


def test_submit_table_progress_and_leaderboard(tmp_path):
    ws = fast_workspace(tmp_path / "ws")
    proc = kernelarc(
        ws, "submit", str(CHEATS / "honest_torch.py"), "--problem", RMS, "--device", "cpu", "--agent", "me"
    )
    assert "decision   ACCEPT" in proc.stdout
    assert "workload" in proc.stdout and "SOL time" in proc.stdout
    assert "correctness:" in proc.stderr and "benchmark:" in proc.stderr  # progress, not on stdout
    board = json.loads(kernelarc(ws, "leaderboard", "--problem", RMS, "--json").stdout.strip().splitlines()[-1])
    assert board["agents"][0]["agent"] == "me" and board["agents"][0]["is_global_best"]
    text = kernelarc(ws, "leaderboard", "--problem", RMS).stdout
    assert "global best" in text


def test_import_and_problems(tmp_path):
    ws = tmp_path / "ws"
    out = kernelarc(ws, "import", str(SOL_EXAMPLES / "gqa_paged_decode_h32_kv8_d128_ps1"), "--json")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["imported"] == "gqa_paged_decode_h32_kv8_d128_ps1"
    assert any("synthesizes" in n for n in info["notes"])
    again = kernelarc(ws, "import", str(SOL_EXAMPLES / "gqa_paged_decode_h32_kv8_d128_ps1"), check=False)
    assert again.returncode == 2 and "already imported" in again.stderr
    listing = json.loads(kernelarc(ws, "problems", "--json").stdout.strip().splitlines()[-1])
    names = {p["name"]: p for p in listing["problems"]}
    assert names["gqa_paged_decode_h32_kv8_d128_ps1"]["origin"] == "workspace"
    assert names[RMS]["origin"] == "seed" and names[RMS]["op_family"] == "rmsnorm"
    table = kernelarc(ws, "problems").stdout
    assert RMS in table and "family" in table


def test_errors_are_clear(tmp_path):
    ws = tmp_path / "ws"
    p = kernelarc(ws, "submit", str(CHEATS / "honest_torch.py"), "--problem", "no_such", "--device", "cpu", check=False)
    assert p.returncode == 2 and "no problem named 'no_such'" in p.stderr
    p = kernelarc(ws, "submit", str(tmp_path / "missing.py"), "--problem", RMS, check=False)
    assert p.returncode == 2 and "no such file" in p.stderr
    p = kernelarc(ws, "import", str(tmp_path), check=False)
    assert p.returncode == 2 and "not a SOL-ExecBench folder" in p.stderr
    p = kernelarc(ws, "submit", str(CHEATS / "honest_torch.py"), "--problem", "../etc", check=False)
    assert p.returncode == 2 and "invalid problem name" in p.stderr


def test_memory_command(tmp_path):
    ws = fast_workspace(tmp_path / "ws")
    out = kernelarc(
        ws, "submit", str(CHEATS / "honest_torch.py"), "--problem", RMS, "--device", "cpu", "--agent", "me", "--json"
    )
    cid = json.loads(out.stdout.strip().splitlines()[-1])["candidate_id"]
    from guard.archive.db import Database
    from guard.workspace import Workspace
    from memory.store import Memory

    w = Workspace.open(ws)
    m = Memory(Database(w.db_path))
    p = w.problems().get(RMS)
    m.record("me", p, "float32 arithmetic keeps the adversarial rounds happy", "insight", cid)
    m.record("me", p, "bf16 squares overflow on large inputs", "pitfall", cid)
    listing = json.loads(kernelarc(ws, "memory", "list", "--json").stdout.strip().splitlines()[-1])
    assert len(listing["conclusions"]) == 2
    search = kernelarc(ws, "memory", "search", "overflow squares", "--problem", RMS, "--json")
    found = json.loads(search.stdout.strip().splitlines()[-1])
    assert found["conclusions"][0]["kind"] == "pitfall"
    exported = kernelarc(ws, "memory", "export").stdout.strip().splitlines()
    assert len(exported) == 2 and json.loads(exported[0])["evidence"] == cid
    assert "pruned 1" in kernelarc(ws, "memory", "prune", "--per-problem", "1").stdout
    bad = kernelarc(ws, "memory", "prune", check=False)
    assert bad.returncode == 2
