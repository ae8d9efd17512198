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
