"""Several devices behind one guard service: which devices, workers pinned to theirs, jobs
spread over them, and comparisons across devices made only from measurements taken on the
device that judges. GPUs are faked through NVML; on the CPU, simulated devices share the
cores (they exercise the scheduling and the bookkeeping, not speed)."""

from __future__ import annotations

import time

import pytest

from guard.archive.db import Database
from guard.candidates.load import from_source
from guard.cascade import Guard, pairing_gate
from guard.jobs import JobQueue
from guard.runner import device as device_mod
from guard.runner import nvml
from guard.workspace import Workspace

from helpers import RMS, fast_config, honest_source, unique


@pytest.fixture
def two_fake_gpus(monkeypatch):
    ids = {0: "GPU-aaaa0000-0000-0000-0000-000000000000", 1: "GPU-bbbb1111-1111-1111-1111-111111111111"}
    monkeypatch.setattr(nvml, "gpu_count", lambda: 2)
    monkeypatch.setattr(
        nvml, "gpu_identity", lambda i=0: {"name": "NVIDIA H200", "uuid": ids[i], "driver": "x"} if i in ids else None
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return ids


def test_every_visible_gpu_is_a_device_of_one_group(two_fake_gpus, monkeypatch):
    devs = device_mod.resolve_all("auto", None)
    assert [d.uuid for d in devs] == [two_fake_gpus[0], two_fake_gpus[1]]
    assert len({d.key for d in devs}) == 2 and {d.compare_key for d in devs} == {"cuda-nvidia-h200"}
    # each worker sees its own GPU and no other
    assert devs[1].worker_env() == {"CUDA_VISIBLE_DEVICES": two_fake_gpus[1]}
    assert device_mod.resolve_all("cuda", 1) == devs[:1]
    with pytest.raises(ValueError, match="3 devices asked for, 2"):
        device_mod.resolve_all("cuda", 3)
    # CUDA_VISIBLE_DEVICES narrows and orders them, by index or by UUID
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [d.uuid for d in device_mod.resolve_all("auto", None)] == [two_fake_gpus[1]]
    assert device_mod.resolve("cuda").uuid == two_fake_gpus[1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{two_fake_gpus[1]},0")
    assert [d.uuid for d in device_mod.resolve_all("auto", None)] == [two_fake_gpus[1], two_fake_gpus[0]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert device_mod.resolve_all("auto", None)[0].kind == "cpu"
    # a MIG instance is refused with a reason, never judged on the CPU in its place
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-0123abcd-0000-0000-0000-000000000000")
    for choice in ("auto", "cuda"):
        with pytest.raises(ValueError, match="MIG instance .* whole GPUs only"):
            device_mod.resolve_all(choice, 1)
    assert device_mod.resolve_all("cpu", 1)[0].kind == "cpu"


def test_device_counts_and_simulated_cpu_devices():
    assert device_mod.parse_count("all") is None and device_mod.parse_count("2") == 2
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match="--devices"):
            device_mod.parse_count(bad)
    one = device_mod.resolve_all("cpu", 1)
    assert len(one) == 1 and not one[0].simulated and one[0].compare_key == one[0].key
    sim = device_mod.resolve_all("cpu", 2)
    assert len({d.key for d in sim}) == 2 and all(d.simulated for d in sim)
    assert {d.compare_key for d in sim} == {one[0].key}
    assert sim[0].worker_env() == {}


def test_rows_from_before_groups_are_adopted(tmp_path):
    db = Database(tmp_path / "w.db")
    common = dict(
        problem="p",
        definition_hash="h",
        agent="a",
        source_hash="s",
        solution_json="{}",
        device_kind="cuda",
        state="done",
    )
    old = db.insert_candidate(device_key="cuda-GPU-1", **common)
    other = db.insert_candidate(device_key="cuda-GPU-2", **common)
    db.adopt_device("cuda-GPU-1", "cuda-nvidia-h200")
    rows = {r["id"]: r for r in db.query("SELECT id, device_key, measured_on FROM candidates")}
    assert (rows[old]["device_key"], rows[old]["measured_on"]) == ("cuda-nvidia-h200", "cuda-GPU-1")
    assert (rows[other]["device_key"], rows[other]["measured_on"]) == ("cuda-GPU-2", None)


def _guards(path, n=2, **overrides):
    ws = Workspace.open(path)
    cfg = fast_config(**overrides)
    # no spare workers started ahead (see helpers.make_guard)
    return [Guard(ws, cfg, device=d, prestart=False) for d in device_mod.resolve_all("cpu", n)]


@pytest.mark.slow
def test_jobs_spread_over_the_devices_and_none_runs_twice(tmp_path):
    from guard.candidates.load import from_source as load

    # few iterations, and no paired re-measurements: only the scheduling is under test. With
    # the CPU's band (2.5x) each of the later honest copies was re-measured side by side with the
    # first, the global best (10-15 s each on 2 cores), work the assertions below never look at
    # (pairing across devices: test_an_incumbent_from_another_device_is_remeasured_on_the_judging_one).
    # A band this narrow makes every stored comparison clear-cut.
    guards = _guards(tmp_path / "ws", pairing_band_cpu=1.000001)
    try:
        with pytest.raises(ValueError, match="one guard per device"):
            JobQueue([guards[0], guards[0]], autostart=False)
        q = JobQueue(guards, autostart=False)
        ids = [q.submit(f"agent-{i}", RMS, load(honest_source(), None, "k.py")) for i in range(4)]
        for t in q._threads:
            t.start()
        deadline = time.monotonic() + 300
        views = []
        for j in ids:
            views.append(q.wait(j, max(1.0, deadline - time.monotonic())))
        q.stop()
        assert all(v.state == "done" for v in views), [(v.state, v.error) for v in views]
        assert {v.device for v in views} == {g.device.key for g in guards}  # both devices judged
        assert len({v.candidate_id for v in views}) == 4  # each job once, each its own candidate
        rows = guards[0].db.query("SELECT measured_on, device_key FROM candidates")
        assert len(rows) == 4 and {r["device_key"] for r in rows} == {guards[0].device.compare_key}
        by_job = {v.candidate_id: v.device for v in views}
        for r in guards[0].db.query("SELECT id, measured_on FROM candidates"):
            assert r["measured_on"] == by_job[r["id"]]  # the verdict came from the device that ran it
    finally:
        for g in guards:
            g.close()


@pytest.mark.slow
def test_an_incumbent_from_another_device_is_remeasured_on_the_judging_one(tmp_path):
    # 2 shared cores are noisy; a band this wide makes every cross-device comparison unclear, so
    # the re-measurement under test happens however far apart a loaded machine puts the windows
    g0, g1 = _guards(tmp_path / "ws", min_iters=10, max_iters=30, noise_sigmas=5, pairing_band_cpu=100.0)
    try:
        source = honest_source()
        first = g0.evaluate(from_source(source, None, "k.py"), RMS, agent="x")
        assert first.decision == "ACCEPT", first.reason
        # the same source again, now judged on the other device: still a duplicate in the group
        dup = g1.evaluate(from_source(source, None, "k.py"), RMS, agent="y")
        assert dup.duplicate_of == first.candidate_id
        # a changed copy judged on device 1 against the incumbent measured on device 0
        other = g1.evaluate(from_source(unique(source), None, "k.py"), RMS, agent="x")
        assert other.status == "PASSED", other.reason
        entry = (other.paired or {}).get("agent")
        assert entry and entry.incumbent == first.candidate_id, other.paired
        assert "another device" in entry.why and g0.device.key in entry.why
        assert entry.paired_speedup is not None, entry.note
        assert other.decision != "ACCEPT", other.reason  # the same kernel, measured side by side
        # control: judged on the incumbent's own device, the stored measurement is comparable
        same = g0.evaluate(from_source(unique(source), None, "k.py"), RMS, agent="x")
        same_entry = (same.paired or {}).get("agent")
        assert "another device" not in str(same_entry and same_entry.why)
    finally:
        g0.close()
        g1.close()


def test_a_best_changed_on_another_device_mid_evaluation_gives_no_accept(tmp_path, monkeypatch):
    """When the best changes on another device while a challenger is measured, the paired
    re-measurement was against the old best; the decision must not come from figures taken on
    two devices."""
    # A loaded machine can put the two windows 2.5x apart, past the default band, where a
    # comparison is clear-cut even across devices; a band this wide keeps the case under test.
    g0, g1 = _guards(tmp_path / "ws", min_iters=10, max_iters=30, pairing_band_cpu=100.0)
    try:
        source = honest_source()
        first = g0.evaluate(from_source(source, None, "k.py"), RMS, agent="x")
        assert first.decision == "ACCEPT", first.reason
        with g0.db.transaction() as c:  # its stored figures 20% slow: alone they would say ACCEPT
            c.execute(
                "UPDATE workload_results SET latency_ms = latency_ms * 1.2, rel_se = 0 WHERE candidate_id = ?",
                (first.candidate_id,),
            )
        # as if paired against a best since replaced
        monkeypatch.setattr(pairing_gate, "pairings", lambda *a, **k: {})
        other = g1.evaluate(from_source(unique(source), None, "k.py"), RMS, agent="x")
        assert other.status == "PASSED", other.reason
        assert other.decision == "KEEP" and "another device" in other.reason, other.reason
    finally:
        g0.close()
        g1.close()


def test_a_cpu_device_is_named_by_the_cores_the_guard_may_use(monkeypatch):
    """A guard pinned to fewer cores (taskset, a container's cpuset) measures another
    machine, as far as its baselines and timings go: its device key differs."""
    monkeypatch.setattr(device_mod.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    two = device_mod.resolve("cpu").key
    monkeypatch.setattr(device_mod.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    one = device_mod.resolve("cpu").key
    assert two != one and device_mod.usable_cores() == 1
