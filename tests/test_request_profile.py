"""The workers' request profiles (a diagnostic of the guard's own speed)."""

from __future__ import annotations

from guard.runner import request_profile
from guard.runner.request_profile import RequestProfiler


def test_profiler_reports_each_request_kind_with_its_heaviest_functions(tmp_path):
    def slow_sum(msg):
        return {"ok": True, "value": sum(i * i for i in range(msg["n"]))}

    prof = RequestProfiler()
    for n in (10_000, 20_000):
        assert prof.handle("check", slow_sum, {"n": n})["value"] == sum(i * i for i in range(n))
    prof.handle("run", lambda msg: {"ok": True}, {})
    prof.write(tmp_path)
    text = (tmp_path / request_profile.FILE_NAME).read_text()
    assert "=== check: 2 request(s)" in text and "=== run: 1 request(s)" in text
    assert "slow_sum" in text.split("=== run")[0]


def test_a_profiled_pool_keeps_each_workers_report(tmp_path, monkeypatch):
    from guard.runner.pool import WorkerPool

    keep = tmp_path / "profiles"
    monkeypatch.setenv(request_profile.ENV, str(keep))
    pool = WorkerPool("cpu", tmp_path / "workers", prestart=False)
    try:
        worker = pool.trusted()
        reply = worker.request({"op": "memory", "reset": False}, 60)
        assert reply.get("ok"), reply
    finally:
        pool.close()
    reports = list(keep.glob("trusted-*.txt"))
    assert len(reports) == 1 and "=== memory: 1 request(s)" in reports[0].read_text()
    assert not (tmp_path / "workers").exists() or not any((tmp_path / "workers").iterdir())


def test_peak_holders_name_what_was_live_at_each_request_kinds_highest_point():
    def frames(line: int) -> list[dict]:
        return [
            {"filename": "/x/torch/cuda/memory.py", "line": 1, "name": "alloc"},
            {"filename": "/repo/guard/runner/refill.py", "line": line, "name": "__call__"},
        ]

    gib = 1 << 30
    trace = [
        {"action": "alloc", "addr": 1, "size": 8 * gib, "frames": frames(10), "time_us": 100},  # arm's set
        {"action": "alloc", "addr": 2, "size": 8 * gib, "frames": frames(20), "time_us": 110},  # a refill
        {"action": "free_requested", "addr": 2, "size": 8 * gib, "time_us": 120},
        {"action": "free_completed", "addr": 2, "size": 8 * gib, "time_us": 121},
        {"action": "alloc", "addr": 3, "size": gib, "frames": frames(30), "time_us": 210},  # during run
        {"action": "free_requested", "addr": 99, "size": gib, "time_us": 220},  # before the history: ignored
        {"action": "alloc", "addr": 4, "size": gib, "frames": frames(40), "time_us": 500},  # outside any request
    ]
    got = request_profile.peak_holders(trace, [("run", 200, 300), ("arm", 90, 150)])
    assert got["arm"] == (
        16 * gib,
        [("guard/runner/refill.py:10 __call__", 8 * gib), ("guard/runner/refill.py:20 __call__", 8 * gib)],
    )
    assert got["run"][0] == 9 * gib
    assert got["outside requests"][0] == 10 * gib
