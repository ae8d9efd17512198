"""The benchmark scripts' own logic, on the CPU: how the seeds table merges runs and vouches
for compile times, how it is written into its document, and the ceilings probe."""

from __future__ import annotations


def test_seeds_table_trusts_compile_times_the_guard_checked():
    """dynamo's counters count over the whole worker: after one frame failed anywhere, an older
    run's counters can no longer vouch for a compile time, but a baseline the guard checked
    for the fall-back (compile_checked) still can; an unchecked one with every frame compiled
    so far can too, and a time with a compile error never."""
    from benchmarks.seeds_bench import compile_check

    def w(uuid):
        return {"uuid": uuid, "compile_ms": 0.01, "eager_ms": 0.02, "sol_ms": 0.001}

    failed_before = {"frames_ok": 8, "frames_total": 9}
    clean = {"frames_ok": 3, "frames_total": 3}
    entry = {
        "triton": {"per_workload": [w("a"), w("b"), w("c"), w("d")]},
        "baseline_diagnostics": [
            {"uuid": "a", "compile_counters": failed_before, "compile_checked": True},
            {"uuid": "b", "compile_counters": failed_before},
            {"uuid": "c", "compile_counters": clean},
            {"uuid": "d", "compile_counters": clean, "compile_checked": True, "compile_error": "fell back"},
        ],
    }
    valid, total = compile_check(entry)
    assert [x["uuid"] for x in valid] == ["a", "c"] and total == 4


def test_seeds_table_merges_runs_and_names_their_ceilings():
    """A later run of the Triton seeds replaces that problem's baselines and Triton figures but
    keeps an earlier run's CUDA seed; every run's ceilings are listed, and "not valid" names
    exactly the problems whose compile time nothing vouches for."""
    from benchmarks.seeds_bench import merge, render

    def run(date, copy, problems):
        return {"date": date, "device": {"name": "GPU", "ceilings": {"copy_bytes_per_s": copy}}, "problems": problems}

    def seed(ms):
        return {
            "status": "PASSED",
            "median_ms": ms,
            "sol_fraction": 0.5,
            "per_workload": [{"uuid": "a", "compile_ms": 0.004, "sol_ms": 0.001}],
        }

    checked = [{"uuid": "a", "compile_counters": {"frames_ok": 1, "frames_total": 1}, "compile_checked": True}]
    first = run(
        "2026-01-01T10:00",
        4e12,
        {
            "p": {"eager_median_ms": 0.05, "triton": seed(0.010), "cuda": seed(0.020)},
            "q": {"eager_median_ms": 0.07, "triton": seed(0.030)},
        },
    )
    later = run(
        "2026-01-01T12:00",
        3e12,
        {"p": {"eager_median_ms": 0.04, "triton": seed(0.009), "baseline_diagnostics": checked}},
    )
    merged = merge([first, later])
    assert merged["problems"]["p"]["cuda"]["median_ms"] == 0.020
    assert merged["problems"]["p"]["triton"]["median_ms"] == 0.009
    assert merged["problems"]["p"]["measured"] == ["2026-01-01T10:00", "2026-01-01T12:00"]
    text = render(merged)
    row_p = next(line for line in text.splitlines() if line.startswith("| p |"))
    assert "| 40.0 | 4.0 | 9.0 | 20.0 |" in row_p
    assert "2026-01-01T10:00: copy 4.00 TB/s" in text and "2026-01-01T12:00: copy 3.00 TB/s" in text
    assert '"not valid" (q)' in text
    assert '"not valid"' not in render(merge([later]))


def test_seeds_table_diagnostics_vouch_only_for_times_of_their_own_run():
    """A later run of the CUDA seeds alone brings checked diagnostics; they must not make an
    older run's (unchecked, possibly eager-in-disguise) Triton compile times look valid: the
    table takes the compile times measured with them. A tie between bounds reads "mixed"."""
    from benchmarks.seeds_bench import merge, render

    def seed(compile_ms, bounds):
        return {
            "status": "PASSED",
            "median_ms": 0.01,
            "sol_fraction": 0.5,
            "per_workload": [
                {"uuid": u, "compile_ms": compile_ms, "sol_ms": 0.001, "bound": b} for u, b in zip("ab", bounds)
            ],
        }

    old = {
        "date": "2026-01-01T10:00",
        "device": {"ceilings": {}},
        "problems": {"p": {"eager_median_ms": 0.05, "triton": seed(0.050, ["memory", "memory"])}},
    }
    checked = [
        {"uuid": u, "compile_counters": {"frames_ok": 1, "frames_total": 1}, "compile_checked": True} for u in "ab"
    ]
    new = {
        "date": "2026-01-02T10:00",
        "device": {"ceilings": {}},
        "problems": {
            "p": {"eager_median_ms": 0.05, "cuda": seed(0.004, ["memory", "compute"]), "baseline_diagnostics": checked}
        },
    }
    row = next(line for line in render(merge([old, new])).splitlines() if line.startswith("| p |"))
    assert row.startswith("| p | - | mixed | 50.0 | 4.0 |"), row
    # the other order: the older run's diagnostics do not vouch for the newer Triton times either
    newer_triton = {
        "date": "2026-01-03T10:00",
        "device": {"ceilings": {}},
        "problems": {"p": {"eager_median_ms": 0.05, "triton": seed(0.050, ["memory", "memory"])}},
    }
    row = next(line for line in render(merge([new, newer_triton])).splitlines() if line.startswith("| p |"))
    assert "| not valid |" in row and "| memory |" in row, row


def test_seeds_table_is_written_between_its_markers_only(tmp_path):
    from benchmarks.seeds_bench import BEGIN, END, _has_block, write_block

    doc = tmp_path / "seeds.md"
    doc.write_text(f"# Title\n\nprose before\n{BEGIN}\nold table\n{END}\nprose after\n")
    assert _has_block(doc)
    write_block(doc, "| new | table |\n|---|---|")
    assert doc.read_text() == f"# Title\n\nprose before\n{BEGIN}\n| new | table |\n|---|---|\n{END}\nprose after\n"
    (tmp_path / "bare.md").write_text("no markers\n")
    assert not _has_block(tmp_path / "bare.md") and not _has_block(tmp_path / "missing.md")


def test_ceilings_probe_runs_and_compares_with_the_guards_measurement(tmp_path):
    """The probe for the next GPU session, checked on the CPU: it runs the guard's own ceiling
    measurement and the ramped one, and its summary compares the two per ceiling."""
    import json
    import subprocess
    import sys

    from helpers import REPO

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.ceilings_probe",
            str(tmp_path),
            "--device",
            "cpu",
            "--repeats",
            "2",
            "--ramp-s",
            "0.05",
            "--reps",
            "2",
            "--batch",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads((tmp_path / "ceilings_probe.json").read_text())
    assert len(r["guard"]) == 2 and all(g["copy_bytes_per_s"] > 0 for g in r["guard"])
    assert [s["ceiling"] for s in r["summary"]] == [
        "copy (read + write)",
        "matmul bfloat16",
        "matmul float16",
        "matmul float32",
    ]
    for s in r["summary"]:
        assert s["ramped"] > 0 and len(s["guard_to_ramped"]) == 2 and s["ramped_median"] <= s["ramped"]
    # the ramped ceiling is the best over every shape of its dtype, not one shape's
    bf16 = [v["best"] for k, v in r["ramped"]["matmul"].items() if k.startswith("bfloat16 ")]
    assert len(bf16) == 2 and r["summary"][1]["ramped"] == max(bf16)
    copy = r["ramped"]["copy"]
    assert len(copy) == 2 and r["summary"][0]["ramped"] == max(v["best"] for v in copy.values())
    assert "| copy (read + write) |" in out.stdout


def test_kernelbench_suite_chooses_files_renames_the_model_and_resumes(tmp_path):
    """Level 1 whole, the first files of levels 2 and 3 by number (not by name: 10 after 9);
    the reference turned into its own ModelNew; rows of an earlier call read back and summed."""
    import json

    from benchmarks import kernelbench_suite as suite

    for level, names in (
        ("level1", ["1_A.py", "2_B.py"]),
        ("level2", ["10_C.py", "9_D.py", "2_E.py"]),
        ("level3", ["3_F.py"]),
    ):
        (tmp_path / level).mkdir()
        for n in names:
            (tmp_path / level / n).write_text("x = 1\n")
    chosen = [f"{p.parent.name}/{p.name}" for p in suite.select(tmp_path, per_level=2)]
    assert chosen == ["level1/1_A.py", "level1/2_B.py", "level2/2_E.py", "level2/9_D.py", "level3/3_F.py"]
    some = [p.name for p in suite.select(tmp_path, per_level=2, only=["2_B", "9_D"])]
    assert some == ["2_B.py", "9_D.py"]

    out, earlier = tmp_path / "out.jsonl", tmp_path / "earlier.jsonl"
    out.write_text('{"file": "level1/1_A.py"}\n')
    earlier.write_text('{"file": "level1/1_A.py"}\n{"file": "level1/2_B.py"}\n')
    assert [r["file"] for r in suite.start_rows(out, earlier)] == ["level1/1_A.py", "level1/2_B.py"]

    src = "class Model(nn.Module):\n    def __init__(self):\n        super(Model, self).__init__()\n"
    assert suite.modelnew_source(src).count("ModelNew") == 2 and "Model(" not in suite.modelnew_source(src)

    rows = [
        {
            "file": "level1/1_A.py",
            "level": "level1",
            "status": "PASSED",
            "import_s": 0.5,
            "wall_s": 10.0,
            "peak_ratio": 1.5,
            "score": 0.25,
        },
        {
            "file": "level1/2_B.py",
            "level": "level1",
            "status": "REJECT",
            "reason": "too slow",
            "import_s": 0.7,
            "wall_s": 20.0,
            "peak_ratio": 3.5,
        },
        {"file": "level2/2_E.py", "level": "level2", "error": "OutOfMemoryError"},
    ]
    saved = tmp_path / "prior.jsonl"
    saved.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert suite.load_rows(saved) == rows
    table = suite.render(rows)
    assert "| 1 | 2 | 1 | 1 | 0 | 0.6 / 0.7 | 15.0 / 20.0 | 3.5 | 0.250 |" in table
    assert "| 2 | 1 | 0 | 0 | 1 |" in table
    assert "peak over 3x: `level1/2_B.py` 3.5x (?), no figures for 3x + 640 MiB" in table
    mib = 1 << 20
    small = {"own_peak_bytes": 66 * mib, "peak_memory_bytes": {"trusted": 474 * mib, "candidate": 672 * mib}}
    large = {"own_peak_bytes": 8210 * mib, "peak_memory_bytes": {"trusted": 16640 * mib, "candidate": 25400 * mib}}
    assert suite.over_bound(small) is False and suite.over_bound(large) is True
    assert suite.over_bound({"own_peak_bytes": None}) is None


def test_kernelbench_suite_renders_a_line_per_file_with_the_gate_of_each_peak():
    from benchmarks import kernelbench_suite as suite

    gib = 1 << 30
    row = {
        "file": "level1/5_Scale.py",
        "wall_s": 103.2,
        "phases_s": {"correctness": 92.4},
        "own_peak_bytes": 8 * gib,
        "peak_memory_by_gate": {
            "correctness": {"trusted": 27 * gib, "trusted.compare": 27 * gib, "candidate": 25 * gib},
            "benchmark": {"trusted": 30 * gib, "candidate": 36 * gib, "candidate.arm": 36 * gib},
        },
        "peak_ratio": 4.5,
        "score": None,
    }
    line = suite.render_files([row]).splitlines()[-1]
    assert line == "| 5_Scale | 103.2 | 92.4 | 8.00 | 30.0 (benchmark) | 36.0 (benchmark) | 4.5 | - |"


def test_kernelbench_suite_summary_counts_each_file_once_by_its_latest_verdict():
    """A results file gathers calls; a file judged again (72 and 75 after the repeat rule of
    session 24) is counted once, by its latest row, and the summary says when it was measured."""
    from benchmarks import kernelbench_suite as suite

    def row(name: str, status: str, date: str, ratio: float) -> dict:
        return {"file": f"level1/{name}.py", "level": "level1", "status": status, "date": date, "peak_ratio": ratio}

    rows = [
        row("72_conv", "INCORRECT_NUMERICAL", "2026-12-02", 2.9),
        row("1_mm", "PASSED", "2026-12-02", 5.0),
        row("72_conv", "PASSED", "2026-12-04", 8.2),
    ]
    assert [r["status"] for r in suite.latest(rows)] == ["PASSED", "PASSED"]
    text = suite.render(rows)
    level = text.splitlines()[2]
    assert level.startswith("| 1 | 2 | 2 | 0 | 0 |") and level.endswith("| 2026-12-02 to 2026-12-04 |"), level
    assert "INCORRECT" not in text and "`level1/72_conv.py` 8.2x (2026-12-04)" in text


def test_guard_bench_sets_config_fields_as_their_types():
    import pytest

    from benchmarks.guard_bench import with_overrides
    from guard.config import GuardConfig

    cfg = with_overrides(GuardConfig(), ["outside_windows_first=2", "target_time_s=0.1"])
    assert (cfg.outside_windows_first, cfg.target_time_s) == (2, 0.1)
    with pytest.raises(SystemExit, match="nope"):
        with_overrides(GuardConfig(), ["nope=1"])
    with pytest.raises(ValueError):  # checked as the field is: windows are at least one
        with_overrides(GuardConfig(), ["outside_windows_first=0"])


def test_guard_bench_says_why_a_verdict_was_paired_and_what_the_pairing_found():
    """Every warm verdict of the 16-workload problem was paired on the H200 (session 46), and
    the figures did not say why: each row now carries the stored and paired speedups, and the
    incumbent's slowdown where the pairing decided nothing."""
    from benchmarks.guard_bench import _decision, _decision_line
    from guard.verdict import Advice, PairedEntry, Verdict

    v = Verdict(
        candidate_id="c-2",
        problem="p",
        agent="a",
        decision="KEEP",
        status="PASSED",
        reason="",
        speedup_vs_best=0.8017,
        threshold=0.01,
        advice=Advice(action="continue", message=""),
        paired={
            "agent": PairedEntry(
                incumbent="c-1",
                stored_speedup=0.8017,
                why="the stored comparison is not clear-cut",
                incumbent_slowdown=1.24,
                inconclusive=True,
                note="the incumbent ran 1.24x slower than its own record allows",
            )
        },
    )
    d = _decision(v)
    assert d["paired_agent"]["stored_speedup"] == 0.8017 and d["paired_agent"]["inconclusive"] is True
    line = _decision_line(d)
    assert "KEEP speedup 0.8017" in line and "stored 0.8017 -> paired none incumbent slowdown 1.240" in line
    assert _decision_line(_decision(v.model_copy(update={"paired": None}))) == "KEEP speedup 0.8017 threshold 0.0100"
    same = v.model_copy(update={"paired": {"agent": v.paired["agent"], "global": v.paired["agent"]}})
    assert _decision_line(_decision(same)) == line  # one incumbent, both labels: said once


def test_guard_bench_before_refuses_a_tree_that_is_not_the_old_guard(tmp_path):
    """The driver of the pre-issue-15 guard imports that tree's own studies: pointed at the
    current checkout, which has no guard/pipeline.py, it says so instead of timing the new guard."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    driver = repo / "benchmarks" / "guard_bench_before.py"
    got = subprocess.run(
        [sys.executable, str(driver), str(tmp_path / "out"), "--tree", str(repo)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 2 and "is not a pre-issue-15 checkout" in got.stderr, got.stderr
    assert not (tmp_path / "out").exists()


def test_guard_bench_writes_the_profiles_so_far_after_each_verdict(tmp_path):
    """Both profiled runs of session 47 were cut by their device calls' limits, and the report,
    written only at the end, was lost: it is now written after every verdict, oldest first."""
    import os

    from benchmarks.guard_bench import _save_profiles

    profiles, out = tmp_path / "profiles", tmp_path / "out"
    profiles.mkdir()
    out.mkdir()
    _save_profiles(None, out)  # not profiling: nothing written
    assert not (out / "worker_profiles.txt").exists()
    (profiles / "candidate-b.txt").write_text("=== run: 16 request(s)\n")
    (profiles / "candidate-a.txt").write_text("=== arm: 16 request(s)\n")
    os.utime(profiles / "candidate-b.txt", (1, 1))  # the older report
    _save_profiles(profiles, out)
    text = (out / "worker_profiles.txt").read_text()
    assert text.index("##### candidate-b") < text.index("##### candidate-a") and "=== arm" in text


def test_guard_bench_counts_the_outside_clocks_floors_windows_and_waits():
    """A floor measured again after a wait for a starting spare (session 47) costs seconds that no
    phase shows: each verdict's row says how many floors, extra windows and waits it had."""
    from types import SimpleNamespace

    from benchmarks.guard_bench import _figures, _windows_line, _workload_lines
    from guard.outside_clock import judge
    from guard.verdict import Timing, WorkloadResult

    clock = judge(0.6, 100, 0.5, 100, 0.9, 0.1, 0.05, 1.5, host_bound=True)
    waited = clock.model_copy(update={"windows": 4, "quiet_wait_s": 2.5})
    floored = Timing.model_validate(
        {"median_ms": 1.0, "method": "cuda-graph+cupti", "floored_by_outside_clock": True, "inside_median_ms": 0.9}
    )
    v = SimpleNamespace(
        workloads=[
            WorkloadResult(uuid="a", latency_ms=1.0, timing=floored.model_copy(update={"outside_clock": waited})),
            WorkloadResult(uuid="b", latency_ms=0.9, timing=Timing(median_ms=0.9, outside_clock=clock)),
            WorkloadResult(uuid="c", latency_ms=None, timing=None),
        ]
    )
    figures = _figures(v)
    outside = ("floored", "windows", "loop_windows", "spare_wait_s")
    assert [figures["a"][k] for k in outside] == [True, 4, 1, 2.5]
    assert [figures["b"][k] for k in outside] == [None, 1, 1, None] and "c" not in figures
    assert _windows_line(figures) == "floored 1, extra windows 3, spare waits 1 (2.5 s)"
    # and each verdict's workloads are printed with them, so that a cut run still says which floored
    lines = _workload_lines(v).splitlines()
    assert len(lines) == 2 and "FLOORED (own 0.9000ms)" in lines[0] and "windows 4" in lines[0]
    assert "(100 calls, captured," in lines[0]  # a window's calls: what outside_window_s_host sets
    assert "FLOORED" not in lines[1] and "host-bound True" in lines[1]


def test_guard_bench_can_let_the_spares_settle_before_each_warm_verdict():
    """Back to back, a warm verdict may time beside the start of the spare the last one took
    (review, session 47); ``settle`` waits for it first, untimed, as an agent's thinking time
    would, and records the wait: both ways of measuring can be reported side by side."""
    from types import SimpleNamespace

    from benchmarks.guard_bench import latency_study
    from guard.verdict import Advice, Verdict

    calls: list[str] = []

    class Guard:
        pool = SimpleNamespace(quiet_spare=lambda: calls.append("settle") or 2.0)

        def evaluate(self, solution, problem, agent):
            calls.append("verdict")
            return Verdict(
                candidate_id=f"c-{len(calls)}",
                problem=problem,
                agent=agent,
                decision="KEEP",
                status="PASSED",
                reason="",
                advice=Advice(action="continue", message=""),
                phases_s={"total": 1.0},
            )

    source = "import triton\n\n@triton.jit\ndef k():\n    pid = tl.program_id(0)\n"
    out = latency_study(Guard(), "p", source, warm_runs=1, settle=True)
    assert calls == ["verdict", "settle", "verdict", "settle", "verdict"]  # none before the cold one
    assert [r["settled_s"] for r in out["warm_trivial"] + out["warm_new_jit"]] == [2.0, 2.0]
    calls.clear()
    out = latency_study(Guard(), "p", source, warm_runs=1)
    assert calls == ["verdict"] * 3 and out["warm_trivial"][0]["settled_s"] is None
