"""Verdicts stored by earlier versions (``verdict_json`` in the workspace database) still
load, and give back the same JSON."""

from __future__ import annotations

import json

import pytest

from guard.verdict import Verdict

from helpers import DATA

STORED = sorted((DATA / "verdicts").glob("*.json"))


def load(name: str) -> Verdict:
    return Verdict.model_validate_json((DATA / "verdicts" / f"{name}.json").read_text())


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_a_stored_verdict_loads_and_keeps_its_shape(path):
    text = path.read_text()
    v = Verdict.model_validate_json(text)
    stored, dumped = json.loads(text), json.loads(v.model_dump_json())
    # fields added since (peak_memory_bytes) come back as null; everything stored is unchanged
    added = {k for k in dumped if k not in stored}
    assert all(dumped[k] is None for k in added), added
    assert {k: x for k, x in dumped.items() if k not in added} == stored


def test_a_verdict_without_ceilings_keeps_its_shape():
    # a verdict given before the device's ceilings were measured has none
    raw = json.loads((DATA / "verdicts" / "rejected_screen.json").read_text())
    del raw["device"]["ceilings"]
    dumped = json.loads(Verdict.model_validate(raw).model_dump_json())
    assert dumped["device"] == raw["device"]
    # fields added since this verdict was stored come back as null
    assert dumped.pop("peak_memory_bytes") is None and dumped.pop("peak_memory_by_gate") is None
    assert dumped == raw


def test_the_parts_are_typed():
    v = load("paired_cpu")
    assert v.checked.visible_workloads == 4 and v.checked.determinism is True
    assert v.device.kind == "cpu" and v.device.group == v.device.key and v.device.ceilings["copy_bytes_per_s"] > 0
    assert v.device.isolation is None and "isolation" not in v.model_dump()["device"]
    assert all(w.timing.method == "host-clock" and w.timing.median_ms == w.latency_ms for w in v.workloads)
    entry = v.paired["agent"]
    assert entry.why == "the stored comparison is not clear-cut" and entry.paired_speedup > 0
    assert len(entry.workloads[v.workloads[0].uuid].incumbent_ms) == 2
    old = load("old_shape_gpu")
    assert old.device.group is None and old.paired["global"].why is None
    assert old.workloads[0].timing.device_ops_per_call == 2 and old.workloads[0].timing.host_median_ms is None
    rejected = load("rejected_screen")
    assert rejected.checked.rounds is None and rejected.model_dump()["checked"] == {}


def test_timing_keeps_fields_it_does_not_name():
    from guard.verdict import WorkloadResult

    w = WorkloadResult(uuid="w", timing={"median_ms": 1.0, "method": "cuda-graph+cupti", "outside_median_ms": 1.2})
    assert w.timing.outside_median_ms == 1.2
    again = WorkloadResult.model_validate_json(w.model_dump_json())
    assert again.model_dump()["timing"] == {"median_ms": 1.0, "method": "cuda-graph+cupti", "outside_median_ms": 1.2}


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_a_stored_verdict_renders(path):
    import io

    from kernelarc_mcp import render

    out = io.StringIO()
    render.verdict(Verdict.model_validate_json(path.read_text()), out)
    assert "advice" in out.getvalue()
