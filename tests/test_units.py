"""Pure pieces: formulas, schema validation, scoring, decisions, comparison, statistics."""

from __future__ import annotations

import json
import math

import pytest
import torch

from guard.config import GuardConfig
from guard.decision import advise, compare, decide
from guard.problems import formulas
from guard.problems.schema import Definition, Workload
from guard.runner.compare import compare as compare_tensors
from guard.runner.timing import summarize
from guard.scoring import geomean, sol_score, sol_time_ms

CFG = GuardConfig()


def test_formulas_are_safe_arithmetic():
    assert formulas.evaluate("2 * M * N * K", {"M": 2, "N": 3, "K": 4}) == 48
    assert formulas.evaluate("max(a, b) // 2", {"a": 7, "b": 3}) == 3
    for bad in ("__import__('os')", "a.b", "[1,2]", "open('x')", "2 ** 1000"):
        with pytest.raises(formulas.FormulaError):
            formulas.evaluate(bad, {"a": 1})


def _definition(**kw):
    base = dict(
        name="t",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": 8}, "h2": {"type": "expr", "expression": "h // 2"}},
        inputs={"x": {"shape": ["n", "h"], "dtype": "bfloat16"}},
        outputs={"y": {"shape": ["n", "h2"], "dtype": "float32"}},
        reference="def run(x):\n    return x\n",
    )
    base.update(kw)
    return Definition.model_validate(base)


def test_definition_resolves_axes_and_costs():
    d = _definition(kernelarc={"flops": "2 * n * h"})
    axes = d.resolve_axes({"n": 3})
    assert axes == {"n": 3, "h": 8, "h2": 4}
    assert d.io_bytes(axes) == 3 * 8 * 2 + 3 * 4 * 4
    assert d.flops(axes) == 48
    assert d.tolerance_for("float32").atol == 1e-4 and d.tolerance_for("bfloat16").rtol == 1e-2


@pytest.mark.parametrize(
    "change,msg",
    [
        ({"name": "../x"}, "invalid problem name"),
        ({"inputs": {"x": {"shape": ["m"], "dtype": "float32"}}}, "undeclared axis"),
        ({"inputs": {"x": {"shape": ["n"], "dtype": "float13"}}}, "unknown dtype"),
        ({"reference": "x = 1"}, "run"),
        ({"kernelarc": {"flops": "import os"}}, "cannot parse"),
    ],
)
def test_definition_rejects_bad_input(change, msg):
    with pytest.raises(ValueError, match=msg):
        _definition(**change)


def test_content_hash_ignores_descriptions_only():
    a, b = _definition(), _definition(description="words")
    assert a.content_hash() == b.content_hash()
    assert _definition(kernelarc={"flops": "n"}).content_hash() != a.content_hash()


def test_workload_cannot_mix_custom_and_random():
    with pytest.raises(ValueError):
        Workload(uuid="w", inputs={"a": {"type": "custom"}, "b": {"type": "random"}})


def test_sol_score():
    assert sol_score(t=2.0, t_sol=1.0, t_base=3.0) == pytest.approx(1 / (1 + 1 / 2))
    assert sol_score(t=3.0, t_sol=1.0, t_base=3.0) == pytest.approx(0.5)
    assert sol_score(t=1.0, t_sol=1.0, t_base=3.0) == 1.0
    assert sol_score(t=0.5, t_sol=1.0, t_base=3.0) == 1.0  # clipped: faster than the bound
    assert sol_score(t=2.0, t_sol=3.0, t_base=2.5) is None  # baseline under the bound
    t, bound = sol_time_ms(flops=1e12, nbytes=1e9, flops_rate=1e15, bandwidth=1e12)
    assert t == pytest.approx(1.0) and bound == "memory"
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)


def test_decisions_respect_noise_threshold():
    old = {"a": (1.0, 0.001), "b": (2.0, 0.001)}
    same = {"a": (1.004, 0.001), "b": (1.996, 0.001)}
    faster = {"a": (0.9, 0.001), "b": (1.8, 0.001)}
    slower = {"a": (1.1, 0.001), "b": (2.2, 0.001)}
    assert decide(compare(same, old, CFG)) == "KEEP"
    assert decide(compare(faster, old, CFG)) == "ACCEPT"
    assert decide(compare(slower, old, CFG)) == "REVERT"
    assert decide(None) == "ACCEPT"
    # a noisy measurement raises the threshold above the 1 % floor
    noisy = {"a": (0.97, 0.05), "b": (1.94, 0.05)}
    cmp = compare(noisy, old, CFG)
    assert cmp.threshold > 0.03 and decide(cmp) == "KEEP"
    assert compare(same, old, CFG).threshold == pytest.approx(0.01)


def _hist(*decisions):
    return [{"decision": d, "created_at": i, "id": f"c{i}", "notes": f"n{i}"} for i, d in enumerate(decisions)]


def test_advice_rules():
    cfg = GuardConfig(redraft_after=3, max_attempts=10, time_budget_s=100)
    assert advise("ACCEPT", _hist("REVERT", "REVERT"), 0.2, 0.2, cfg, now=1).action == "continue"
    a = advise("KEEP", _hist("ACCEPT", "REVERT", "REJECT"), 0.2, 0.2, cfg, now=1)
    assert a.action == "redraft" and a.non_improving == 3 and a.tried
    assert advise("KEEP", _hist("ACCEPT"), 0.95, 0.2, cfg, now=1).action == "stop"
    assert advise("KEEP", _hist(*["ACCEPT"] * 9), 0.2, 0.2, cfg, now=1).action == "stop"
    assert "time budget" in advise("KEEP", _hist("ACCEPT"), 0.1, 0.1, cfg, now=500).message


def test_tensor_comparison_reports_where_and_how_much():
    ref = torch.ones(4, 5, dtype=torch.float32)
    out = ref.clone()
    out[2, 3] = 1.5
    r = compare_tensors(out, ref, 1e-4, 1e-4)
    assert not r["ok"] and r["status"] == "INCORRECT_NUMERICAL"
    assert "[2, 3]" in r["message"] and r["mismatches"] == 1 and r["max_abs"] == pytest.approx(0.5)
    nan = ref.clone()
    nan[0, 0] = math.nan
    assert "NaN" in compare_tensors(nan, ref, 1e-2, 1e-2)["message"]
    assert compare_tensors(ref.double(), ref, 1, 1)["status"] == "INCORRECT_DTYPE"
    assert compare_tensors(ref[:2], ref, 1, 1)["status"] == "INCORRECT_SHAPE"
    inf = torch.tensor([-math.inf, 1.0])
    assert compare_tensors(inf.clone(), inf, 1e-4, 1e-4)["ok"]  # same infinities match
    ints = torch.tensor([1, 2, 3])
    assert not compare_tensors(torch.tensor([1, 2, 4]), ints, 0, 0)["ok"]


def test_timing_statistics():
    s = summarize([1.0] * 50 + [1.1] * 50)
    assert s["median_ms"] == pytest.approx(1.05) and s["n"] == 100
    assert 0 < s["rel_se"] < 0.05


class _Rec:
    """A stand-in for a CUPTI record as torch.profiler returns it."""

    def __init__(self, name, device, corr, start_ns, dur_ns):
        self._n, self._d, self._c, self._s, self._t = name, device, corr, start_ns, dur_ns

    def name(self):
        return self._n

    def device_type(self):
        return f"DeviceType.{self._d}"

    def correlation_id(self):
        return self._c

    def start_ns(self):
        return self._s

    def duration_ns(self):
        return self._t


def test_graph_launch_spans_cover_all_device_work_of_each_launch():
    from guard.runner.cupti_spans import graph_launch_spans

    recs = [
        _Rec("cudaGraphLaunch", "CPU", 7, 1_000, 500),
        _Rec("fill_kernel", "CUDA", 6, 2_000, 40_000),  # the flush: launched eagerly, not ours
        _Rec("cudaGraphLaunch", "CPU", 9, 50_000, 500),
        _Rec("k1", "CUDA", 7, 42_000, 3_000),
        _Rec("k2_side_stream", "CUDA", 7, 43_000, 4_000),  # overlaps k1: span, not sum
        _Rec("k1", "CUDA", 9, 90_000, 2_000),
        _Rec("memcpy", "CUDA", 9, 93_000, 1_000),
    ]
    spans, why, ops = graph_launch_spans(recs, 2)
    assert why is None
    assert spans == [5_000 / 1e6, 4_000 / 1e6] and ops == [2, 2]
    # a launch without device work, or a missing launch, means the records cannot be used
    spans, why, _ = graph_launch_spans(recs[:5], 2)
    assert spans is None and "1 of 2" in why
    spans, why, _ = graph_launch_spans(recs, 3)
    assert spans is None and "2 graph launches" in why


def test_a_profiler_session_leaves_the_worker_intact():
    """The GPU timer runs CUPTI sessions inside the worker; one must not read as a patch.
    Run as a GPU worker would (torch.cuda.is_available() true when the harness loads)."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "from guard.runner import harness\n"
        "with harness.T.profile(activities=[torch.profiler.ProfilerActivity.CPU]):\n"
        "    torch.ones(8).sum()\n"
        "print(repr(harness.violations()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_outputs_are_scrambled_in_every_nested_container():
    from guard.runner.replays import scramble

    f, i, b = torch.zeros(300), torch.zeros(300, dtype=torch.int32), torch.zeros(300, dtype=torch.bool)
    scramble([f, {"i": i}, (b,)], torch.Generator().manual_seed(1))
    # new random values everywhere, not a fixed poison a kernel could look for
    assert torch.isfinite(f).all() and len(torch.unique(f)) > 200
    assert len(torch.unique(i)) > 200 and 0 < int(b.sum()) < 300


def test_container_subclasses_are_refused_as_outputs():
    from guard.runner.common import CandidateFault, normalize_outputs

    class Lazy(list):  # could run code whenever the guard reads it
        pass

    with pytest.raises(CandidateFault, match="subclass of a container"):
        normalize_outputs(Lazy([torch.ones(1)]), ["y"])
    values, indices = normalize_outputs(torch.max(torch.ones(2, 3), dim=1), ["values", "indices"])
    assert values.shape == indices.shape == (2,)  # torch's own result tuples are fine


def test_compile_baselines_of_many_problems_are_all_compiled():
    """Every reference decorated with @torch.no_grad() shares one wrapper function; compiling
    that wrapper reached dynamo's recompile limit after eight frames in a worker, and every
    later problem's "compile" baseline ran eagerly (seen on the H200: compile equal to eager on
    whole problems). The guard compiles each reference's own function instead (raising the limit
    alone would only move the problem to the 65th frame)."""
    import subprocess
    import sys

    script = """
import torch
from torch._dynamo.utils import counters
from guard.runner.trusted_role import _compile, _dynamo_counters
fns = []
for i in range(70):  # more problems than the recompile limit, each reference from its own source
    ns = {"torch": torch}
    exec(f"@torch.no_grad()\\ndef run(x):\\n    return x * {i} + 1\\n", ns)
    fns.append(ns["run"])
for i, fn in enumerate(fns):
    out = _compile(fn, "default", backend="eager")(torch.ones(3))
    assert out.tolist() == [i + 1.0] * 3, out
c = _dynamo_counters()
assert c["frames_ok"] == c["frames_total"] == 70, c
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_compile_baseline_that_fell_back_is_reported_by_the_worker(tmp_path, monkeypatch):
    """When dynamo reports a frame it could not compile, the worker drops that workload's
    compile time and says the problem fell back; a clean workload keeps its time."""
    from guard.problems.derive import workload_set
    from guard.problems.store import load_problem
    from guard.runner import trusted_role as tr
    from seeds import SEEDS_DIR

    prob = load_problem(SEEDS_DIR / "rmsnorm_llama3_8b")
    d = prob.definition
    visible = workload_set(prob, "cpu", b"secret").visible[:2]
    # frames (total, ok) as dynamo would count them: the first workload compiles, the second
    # fails one frame
    frames = iter([(0, 0), (1, 1), (1, 1), (3, 2)])

    def counters():
        total, ok = next(frames)
        return {"frames_ok": ok, "frames_total": total, "unique_graphs": ok, "graph_breaks": 0, "recompiles": None}

    monkeypatch.setattr(tr, "_dynamo_counters", counters)
    monkeypatch.setattr(tr, "_compile", lambda fn, mode: fn)  # the bookkeeping, not inductor, is tested
    role = tr.TrustedRole("cpu", tmp_path)
    key = d.content_hash()
    assert role.handle({"op": "problem", "key": key, "definition": d.to_json(), "blob_root": None})["ok"]
    cfg = {"min_iters": 3, "max_iters": 5, "max_timing_s": 5.0, "target_time_s": 0.01, "warmup_time_s": 0.0}
    replies = [
        role.handle(
            {
                "op": "baseline",
                "key": key,
                "workload": w.model_dump(mode="json"),
                "axes": d.resolve_axes(w.axes),
                "sets": [1, 2],
                "config": cfg,
                "compile": True,
            }
        )
        for w in visible
    ]
    assert all(r["ok"] and r["compile_checked"] for r in replies), replies
    assert replies[0]["compiled"] is not None and not replies[0].get("compile_error")
    assert not replies[0].get("compile_fell_back")
    fell_back = replies[1]
    assert fell_back["compiled"] is None and fell_back["compile_fell_back"]
    assert "fell back" in fell_back["compile_error"]


def test_the_guard_asks_no_compile_time_after_a_fall_back_and_remeasures_unchecked_baselines(tmp_path, monkeypatch):
    """The guard keeps the fall-back with the baselines (so it survives a new trusted worker):
    after one, no later workload of the problem is compiled. A cached baseline made without
    the fall-back check is measured again."""
    from guard.problems.derive import workload_set

    from helpers import RMS, make_guard

    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))  # no other test's baselines
    g = make_guard(tmp_path / "ws", compile_baseline=True)
    try:
        problem = g.store.get(RMS)
        d = problem.definition
        visible = workload_set(problem, "cpu", g._secret).visible[:4]
        # an old baseline of the first workload: a compile time nobody checked
        g.db.put_baseline(
            d.content_hash(),
            visible[0].uuid,
            g.device.key,
            {"eager": {"median_ms": 1.0}, "compiled": {"median_ms": 1.0}},
        )
        asked = []

        def fake_request(trusted, msg, reply_model, timeout):
            asked.append((msg.workload["uuid"], msg.compile))
            fell = len(asked) == 2
            return reply_model(
                ok=True,
                eager={"median_ms": 2.0},
                compile_checked=msg.compile,
                compiled=None if fell or not msg.compile else {"median_ms": 1.0},
                compile_fell_back=fell or None,
            )

        monkeypatch.setattr(g.reference, "request", fake_request)
        out = g.reference.ensure_baselines(None, problem, "key", visible, lambda *a: None)
        assert asked == [
            (visible[0].uuid, True),
            (visible[1].uuid, True),
            (visible[2].uuid, False),
            (visible[3].uuid, False),
        ]
        assert out[visible[0].uuid]["compiled"] is not None  # re-measured with the check
        later = out[visible[3].uuid]
        assert later["compiled"] is None and later["compile_fell_back"] and "earlier workload" in later["compile_error"]
        assert g.db.baseline(d.content_hash(), visible[3].uuid, g.device.key)["compile_checked"]
        # cached now, every one checked: nothing is asked again
        asked.clear()
        g.reference.ensure_baselines(None, problem, "key", visible, lambda *a: None)
        assert asked == []
    finally:
        g.close()


def test_only_grad_mode_wrappers_are_removed_before_compiling():
    """no_grad's wrapper is shared by every decorated function and is removed; a decorator
    that changes what is computed is kept."""
    import functools

    from guard.runner.trusted_role import _is_grad_mode_wrapper

    @torch.no_grad()
    def plain(x):
        return x + 1

    def doubles(fn):
        @functools.wraps(fn)
        def wrapper(x):
            return 2 * fn(x)

        return wrapper

    @doubles
    def scaled(x):
        return x + 1

    @torch.inference_mode()
    def inference(x):
        return x + 1

    assert _is_grad_mode_wrapper(plain) and not _is_grad_mode_wrapper(plain.__wrapped__)
    assert _is_grad_mode_wrapper(inference)
    assert not _is_grad_mode_wrapper(scaled) and not _is_grad_mode_wrapper(torch.autocast("cpu")(scaled))


def test_a_new_workspace_takes_the_baselines_another_measured_on_this_machine(tmp_path, monkeypatch):
    """Baselines go to the cache folder as well as the workspace's database: a second
    workspace (a demo started afresh, a test) on the same problem, device and settings asks
    the trusted worker for none; other settings, or a file that holds no baseline, are a
    miss."""
    from guard.cascade import baseline_cache
    from guard.problems.derive import workload_set

    from helpers import RMS, make_guard

    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))
    asked: list[str] = []

    def fake_request(trusted, msg, reply_model, timeout):
        asked.append(msg.workload["uuid"])
        return reply_model(ok=True, eager={"median_ms": 2.0}, compile_checked=msg.compile)

    def baselines(ws: str, **cfg) -> dict:
        g = make_guard(tmp_path / ws, **cfg)
        try:
            problem = g.store.get(RMS)
            visible = workload_set(problem, "cpu", g._secret).visible[:2]
            monkeypatch.setattr(g.reference, "request", fake_request)
            out = g.reference.ensure_baselines(None, problem, "key", visible, lambda *a: None)
            assert set(out) == {w.uuid for w in visible}
            # the workspace keeps its own copy
            assert all(g.db.baseline(problem.definition.content_hash(), u, g.device.key) for u in out)
            return out
        finally:
            g.close()

    first = baselines("ws1")
    assert len(asked) == 2 and len(list(baseline_cache.baselines_dir().glob("*.json"))) == 2
    asked.clear()
    assert baselines("ws2") == first and asked == []  # measured by ws1: nothing asked
    assert baselines("ws3", min_iters=7) and len(asked) == 2  # other settings: measured
    asked.clear()
    for f in baseline_cache.baselines_dir().glob("*.json"):
        f.write_text('{"not": "a baseline"}')
    baselines("ws4")
    assert len(asked) == 2  # unreadable entries are misses
    asked.clear()
    baselines("ws4", min_iters=7)
    assert len(asked) == 2  # the workspace's own rows, measured with other settings, are misses too


def test_a_baseline_is_named_by_the_workloads_content_not_its_uuid(tmp_path, monkeypatch):
    """Two problem folders may reuse a workload's uuid, and a workload edited in place keeps
    it: a baseline measured at other sizes must not stand for this one's."""
    from guard.cascade import baseline_cache
    from guard.problems.derive import workload_set

    from helpers import RMS, make_guard

    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))
    asked: list[dict] = []

    def fake_request(trusted, msg, reply_model, timeout):
        asked.append(msg.workload)
        return reply_model(ok=True, eager={"median_ms": float(len(asked))}, compile_checked=msg.compile)

    def baselines(ws: str, resize: bool) -> dict:
        g = make_guard(tmp_path / ws)
        try:
            problem = g.store.get(RMS)
            w = workload_set(problem, "cpu", g._secret).visible[0]
            if resize:  # same uuid, other sizes
                w = w.model_copy(update={"axes": {k: v * 2 if isinstance(v, int) else v for k, v in w.axes.items()}})
            monkeypatch.setattr(g.reference, "request", fake_request)
            return g.reference.ensure_baselines(None, problem, "key", [w], lambda *a: None)[w.uuid]
        finally:
            g.close()

    small = baselines("ws1", resize=False)
    large = baselines("ws2", resize=True)
    assert len(asked) == 2 and large["eager"] != small["eager"]  # not taken from ws1's
    assert baselines("ws3", resize=False)["eager"] == small["eager"] and len(asked) == 2
    assert len(list(baseline_cache.baselines_dir().glob("*.json"))) == 2
    from guard.runner.device import DeviceChoice

    assert not DeviceChoice("cuda", "cuda-unknown", "cuda").identified
    assert DeviceChoice("cpu", "cpu-x86_64-2", "cpu").identified


def test_a_ceilings_file_that_holds_none_of_this_device_is_measured_again(tmp_path, monkeypatch):
    """The device's ceilings are cached per device key: a file that cannot be read, or holds
    another device's, is measured again rather than failing every later start; a device the
    guard cannot name keeps its figures in memory only."""
    import dataclasses

    from guard.cascade import reference_side

    from helpers import make_guard

    monkeypatch.setenv("KERNELARC_CACHE_DIR", str(tmp_path / "cache"))
    asked: list[str] = []

    def fake_request(trusted, msg, reply_model, timeout):
        asked.append(msg.op)
        return reply_model(ok=True, ceilings={"bandwidth_gbs": 10.0})

    def ceilings(key: str | None = None) -> dict:
        g = make_guard(tmp_path / f"ws{len(asked)}", prestart=False)
        try:
            if key is not None:
                monkeypatch.setattr(g.reference, "device", dataclasses.replace(g.reference.device, key=key))
            monkeypatch.setattr(g.reference, "request", fake_request)
            return g.reference.ensure_ceilings(None)
        finally:
            g.close()

    first = ceilings()
    path = reference_side.ceilings_cache_dir() / f"{first['device_key']}.json"
    assert asked == ["ceilings"] and path.is_file()
    assert ceilings() == first and asked == ["ceilings"]  # taken from the file
    path.write_text("{not json")
    assert ceilings()["bandwidth_gbs"] == 10.0 and len(asked) == 2
    ceilings("cuda-unknown")
    assert len(asked) == 3 and not (path.parent / "cuda-unknown.json").exists()
    # a file of an older format (measured another way) is measured again
    path.write_text(json.dumps({**first, "format": reference_side.CEILINGS_FORMAT - 1}))
    assert ceilings()["format"] == reference_side.CEILINGS_FORMAT and len(asked) == 4


def test_adversarial_rounds_scale_only_the_inputs_a_definition_names():
    """A LayerNorm's adversarial rounds were off because they scaled weight and bias too; a
    definition may now name the inputs to scale (red team, session 46: without them a LayerNorm
    that ignored eps was ACCEPTed)."""
    from pydantic import ValidationError

    from guard.problems.schema import Definition
    from guard.runner.inputs import InputMaker

    spec = {
        "name": "ln",
        "reference": "def run(x, w):\n    return x * w\n",
        "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n", 64], "dtype": "float32"}, "w": {"shape": [64], "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n", 64], "dtype": "float32"}},
        "kernelarc": {"adversarial": ["x"]},
    }
    d = Definition.model_validate(spec)
    maker = InputMaker(d.model_dump(mode="json"), "cpu", None)
    normal = maker.make({"inputs": {}}, {"n": 8}, 7, "normal")
    large = maker.make({"inputs": {}}, {"n": 8}, 7, "large")
    assert large[0].abs().max() > 1e6 * normal[0].abs().max()  # the activation scaled
    assert torch.equal(large[1], normal[1])  # the parameter drawn as in a normal round
    every = Definition.model_validate({**spec, "kernelarc": {"adversarial": True}})
    both = InputMaker(every.model_dump(mode="json"), "cpu", None).make({"inputs": {}}, {"n": 8}, 7, "large")
    assert not torch.equal(both[1], normal[1])
    scalar = {**spec, "inputs": {**spec["inputs"], "eps": {"shape": None, "dtype": "float32"}}}
    for wrong, base in ((["bias"], spec), ([], spec), (["eps"], scalar)):  # unknown, none, nothing to scale
        with pytest.raises(ValidationError, match="kernelarc.adversarial names no floating-point tensor input"):
            Definition.model_validate({**base, "kernelarc": {"adversarial": wrong}})


class _CountingProfiler:
    """A stand-in for torch's profiler: counts its stops."""

    def __init__(self) -> None:
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1


def test_a_timed_loops_profiler_stops_once_when_its_statistics_are_read():
    """Session 47: the profiler's stop (54 ms a workload on an H100) moved from the end of the
    timed loop, inside the ``run`` request the benchmark waits for, to the ``stats`` read, which
    the guard overlaps with its check of the loop's sample. It stops exactly once, before the
    records are read, whoever asks first."""
    from guard.runner.timing import PendingStats

    prof = _CountingProfiler()
    seen = []
    pending = PendingStats(prof, None, lambda got, error: seen.append((prof.stops, (got, error))) or {"median_ms": 1.0})
    assert prof.stops == 0  # still recording after the loop
    assert pending.read() == {"median_ms": 1.0} and seen == [(1, (prof, None))]
    pending.drop()
    assert prof.stops == 1
    # a loop timed without a profiler (the CPU) has nothing to stop
    quiet = PendingStats(None, "off", lambda got, error: {"error": error, "profiler": got})
    quiet.drop()
    assert prof.stops == 1 and quiet.read() == {"error": "off", "profiler": None}


def test_the_candidate_worker_stops_an_unread_loops_profiler_before_other_work():
    """A request other than ``stats`` (or a memory reading) after ``run`` drops the loop's
    pending statistics, stopping its profiler first; ``stats`` itself reads them once."""
    from guard.runner import messages as m
    from guard.runner.candidate_role import CandidateRole

    class Pending:
        def __init__(self):
            self.dropped = self.read_count = 0

        def drop(self):
            self.dropped += 1

        def read(self):
            self.read_count += 1
            return {"median_ms": 1.0}

    role = CandidateRole.__new__(CandidateRole)  # its requests' dispatch alone
    role._pending = first = Pending()
    role.kept = None  # a GPU's: no timed outputs held
    role.memory = lambda msg: m.Reply(ok=True)
    role.handle(m.Memory().model_dump())
    assert role._pending is first and first.dropped == 0  # a memory reading leaves it
    role.confirm = lambda msg: m.Reply(ok=True)
    role.handle(m.Confirm(seed=1, iters=2, pad_passes=0, copies=False).model_dump())
    assert role._pending is None and first.dropped == 1
    role._pending = second = Pending()
    role._check_integrity = lambda phase: None
    reply = role.handle(m.Stats().model_dump())
    assert reply["ok"] and second.read_count == 1 and second.dropped == 0 and role._pending is None
