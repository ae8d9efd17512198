"""The cascade end to end on the CPU: honest PyTorch and Triton candidates, decisions,
duplicates, the archive (faults and the recovery after them: tests/test_defences.py)."""

from __future__ import annotations

import time

import pytest

from guard.candidates.load import from_source
from seeds import SEEDS_DIR

from helpers import CHEATS, RMS, honest_source, make_guard, speed_of_light_out_of_reach, unique


def submit(guard, source, agent, language=None, **kw):
    return guard.evaluate(from_source(source, language, "kernel.py"), RMS, agent=agent, **kw)


def slow_source() -> str:
    # the honest kernel doing its work 100 times over: slower by far more than any noise (a
    # loaded 2-core machine moved one kernel's windows up to 3x apart). 400 passes made each
    # verdict on it 2-3x longer (its timed loops and the outside clock's windows) for nothing.
    return unique(
        "import torch\n\n"
        "def run(hidden_states, weight):\n"
        "    for _ in range(100):\n"
        "        x = hidden_states.float()\n"
        "        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()\n"
        "    return y.to(hidden_states.dtype)\n"
    )


@pytest.mark.slow
def test_honest_pytorch_then_slower_then_duplicate(session_tmp):
    guard = make_guard(session_tmp / "ws-decisions", min_iters=10, max_iters=30)
    speed_of_light_out_of_reach(guard)  # the first advice is "continue" however loaded the machine
    try:
        _decisions(guard)
    finally:
        guard.close()


def _decisions(guard):
    first = submit(guard, honest_source(), "agent-a", notes="plain torch")
    assert first.decision == "ACCEPT" and first.status == "PASSED", first.reason
    assert first.agent_best_id == first.candidate_id
    assert first.checked.visible_workloads >= 1 and first.checked.heldout_workloads >= 1
    # every verdict says how the candidate's worker was isolated (never silently none)
    assert first.device.isolation and first.device.isolation.startswith("isolation: ")
    # and what the guard's own clock measured beside the candidate's figure, per workload
    clock = first.workloads[0].timing.model_dump()["outside_clock"]
    # on a CPU each window has at least the timed loop's calls, more for a short call
    # (``outside_window_s_cpu``: a window of a few calls was noise)
    assert clock["agrees"] and clock["run_iters"] >= first.workloads[0].timing.n
    assert clock["run_wall_s"] >= guard.cfg.outside_window_s_cpu / 2
    for w in first.workloads:
        assert w.latency_ms > 0 and w.eager_ms > 0 and w.sol_ms > 0
        assert w.iterations >= guard.cfg.min_iters
        assert w.timing.method == "host-clock"
    assert first.score is not None and 0 <= first.score <= 1
    assert first.advice.action == "continue"

    slow = submit(guard, slow_source_text := slow_source(), "agent-a", notes="100 passes")
    assert slow.status == "PASSED"
    assert slow.decision == "REVERT", slow.reason
    assert slow.agent_best_id == first.candidate_id and first.candidate_id in slow.reason
    assert slow.speedup_vs_best < 1

    # The identical source again, from another agent: judged from the stored measurement (the
    # slow candidate's above), not re-run.
    dup = guard.evaluate(from_source(slow_source_text, None, "kernel.py"), RMS, agent="agent-c")
    assert dup.duplicate_of == slow.candidate_id
    assert "not measured again" in dup.reason
    assert dup.phases_s == {}


@pytest.fixture(scope="module")
def roomy_guard(session_tmp):
    """Every gate on, with the fast settings' call and build budgets (the session's ``guard``
    cuts calls at 10 s, for the hung candidates): for Triton's interpreter and C++ builds,
    which a loaded machine makes slow."""
    g = make_guard(session_tmp / "ws-roomy")
    yield g
    g.close()


def test_triton_seed_passes_on_cpu_interpreter(roomy_guard):
    seed = (SEEDS_DIR / RMS / "seed_triton.py").read_text()
    v = submit(roomy_guard, unique(seed), "triton-agent", language="triton")
    assert v.status == "PASSED", f"{v.reason}\n{v.diagnostic}"
    assert v.decision == "ACCEPT"


@pytest.mark.slow
def test_global_best_and_archive(session_tmp):
    g = make_guard(session_tmp / "ws-global", min_iters=10, max_iters=40)
    try:
        a = submit(g, slow_source(), "alpha")
        assert a.decision == "ACCEPT" and a.is_global_best
        b = submit(g, honest_source(), "beta")
        assert b.decision == "ACCEPT" and b.is_global_best, b.reason  # 100x less work than alpha's
        c = submit(g, slow_source(), "gamma")
        assert c.decision == "ACCEPT" and not c.is_global_best
        assert c.global_best_id == b.candidate_id
        import git

        log = [c.message for c in git.Repo(g.ws.archive_dir).iter_commits()]
        assert any(b.candidate_id in m and "global best" in m for m in log)
        assert (g.ws.archive_dir / RMS / "beta" / b.candidate_id / "sources" / "kernel.py").is_file()
    finally:
        g.close()


@pytest.mark.slow
def test_redraft_and_stop_advice(session_tmp):
    g = make_guard(session_tmp / "ws-advice", redraft_after=2, max_attempts=4)
    speed_of_light_out_of_reach(g)  # only the counts may decide the advice here
    try:
        first = submit(g, honest_source(), "r")
        assert first.advice.action == "continue"
        s1 = submit(g, slow_source(), "r", notes="unrolled everything")
        assert s1.advice.action == "continue" and s1.advice.non_improving == 1
        s2 = submit(g, slow_source(), "r", notes="bigger blocks")
        assert s2.advice.action == "redraft" and s2.advice.non_improving == 2
        assert any("unrolled everything" in t for t in s2.advice.tried)
        s3 = submit(g, slow_source(), "r")
        assert s3.advice.action == "stop" and "attempt budget" in s3.advice.message
    finally:
        g.close()


# Faults (a hung call, a candidate out of memory) get their verdict within the call timeout and the
# next candidate is judged correctly: tests/test_defences.py (infinite_loop, out_of_memory).


def test_compile_error_is_trimmed(guard):
    bad = "import torch\n\ndef run(hidden_states, weight)\n    return hidden_states\n"
    v = submit(guard, bad, "syntax")
    assert v.status == "COMPILE_ERROR" and v.gate == "screen"
    assert "kernel.py:3" in v.reason

    import_error = (
        "import torch\nimport no_such_module_anywhere\n\ndef run(hidden_states, weight):\n    return hidden_states\n"
    )
    v = submit(guard, import_error, "import")
    assert v.status == "COMPILE_ERROR" and v.gate == "build"
    assert "no_such_module_anywhere" in v.diagnostic
    assert "guard/" not in v.diagnostic  # the guard's own frames are trimmed away


def test_triton_compile_error(roomy_guard):
    src = unique(
        "import torch\nimport triton\nimport triton.language as tl\n\n"
        "@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n"
        "    x = tl.load(x_ptr + tl.arange(0, BLOCK))\n"
        "    tl.store(x_ptr + tl.arange(0, BLOCK), undefined_name)\n\n"
        "def run(hidden_states, weight):\n"
        "    y = hidden_states.clone()\n    k[(1,)](y, BLOCK=16)\n    return y\n"
    )
    v = submit(roomy_guard, src, "triton-bad", language="triton")
    assert v.decision == "REJECT"
    assert v.status in ("COMPILE_ERROR", "RUNTIME_ERROR")
    assert "undefined_name" in (v.diagnostic or v.reason)


# The candidates below include <torch/types.h> (torch::Tensor and ATen's ops), as a kernel may,
# rather than <torch/extension.h>: the same builder, binding and compiler noise, at a third of
# the compile time of torch's whole C++ API on 2 cores (17 s against 51 s for g++ -O3, 16 s
# against 28 s for nvcc). The generated binding includes <torch/extension.h> itself.
CPP_RMSNORM = r"""
#include <torch/types.h>

// plain C++ on torch's CPU ops: exercises the C++ builder and the generated binding
torch::Tensor run(torch::Tensor hidden_states, torch::Tensor weight) {
  auto x = hidden_states.to(torch::kFloat32);
  auto inv = torch::rsqrt(x.pow(2).mean(-1, true) + 1e-5);
  return (x * inv * weight.to(torch::kFloat32)).to(hidden_states.scalar_type());
}
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two compiles of torch's headers: ~60 s on 2 idle cores, 270 s seen loaded
def test_cpp_candidate_builds_and_passes(roomy_guard):
    g = roomy_guard
    v = g.evaluate(from_source(unique(CPP_RMSNORM, "//"), "cuda_cpp", "kernel.cpp"), RMS, agent="cpp")
    assert v.status == "PASSED", f"{v.reason}\n{v.diagnostic}"


@pytest.mark.slow
def test_cuda_compile_errors_come_back_trimmed(roomy_guard):
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    bad = (
        "#include <torch/types.h>\n"
        "__global__ void k(float* x) { x[threadIdx.x] = undefined_var; }\n"
        "torch::Tensor run(torch::Tensor hidden_states, torch::Tensor weight) {\n"
        "  k<<<1, 32>>>(hidden_states.data_ptr<float>());\n  return hidden_states;\n}\n"
    )
    v = roomy_guard.evaluate(from_source(unique(bad, "//"), "cuda_cpp", "kernel.cu"), RMS, agent="nvcc")
    assert v.status == "COMPILE_ERROR" and v.gate == "build"
    assert 'kernel.cu(2): error: identifier "undefined_var" is undefined' in v.reason
    assert len(v.diagnostic.splitlines()) < 10


def test_repetition_is_noticed(session_tmp):
    g = make_guard(session_tmp / "ws-repeat")
    try:
        base = (CHEATS / "honest_torch.py").read_text()
        first = submit(g, base, "rita", notes="plain float32 torch with rsqrt and a weight multiply")
        assert first.repeats == []
        commented = "# the same kernel, reformatted\n" + base.replace("    x = ", "    x  =  ")
        again = submit(g, commented, "rita", notes="something else entirely different words")
        assert any("same code as " + first.candidate_id in r for r in again.repeats), again.repeats
        plan = submit(g, slow_source(), "sam", notes="plain float32 torch with rsqrt and weight multiply")
        assert any("plan like this" in r and first.candidate_id in r and "rita" in r for r in plan.repeats), (
            plan.repeats
        )
    finally:
        g.close()


def _dps_solution(body: str):
    import json

    from guard.candidates.load import from_solution_json

    return from_solution_json(
        json.dumps(
            {
                "name": "rms-dps",
                "spec": {"languages": ["pytorch"], "entry_point": "k.py::run", "destination_passing_style": True},
                "sources": [{"path": "k.py", "content": unique(body)}],
            }
        )
    )


DPS_HONEST = (
    "import torch\n\n"
    "def run(hidden_states, weight, output):\n"
    "    x = hidden_states.float()\n"
    "    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()\n"
    "    output.copy_(y.to(output.dtype))\n"
)

# Honest for the first two calls on an output buffer (correctness, with its determinism
# repeat, never calls more often), then returns at once: timing reuses its buffers, so the
# skipped calls would leave the earlier, correct result in place.
DPS_SKIPS = (
    "import torch\n\n"
    "_calls = {}\n"
    "_alive = []  # keeps each buffer alive, so no other tensor takes its id\n\n"
    "def run(hidden_states, weight, output):\n"
    "    _alive.append(output)\n"
    "    _calls[id(output)] = _calls.get(id(output), 0) + 1\n"
    "    if _calls[id(output)] > 2:\n"
    "        return\n"
    "    x = hidden_states.float()\n"
    "    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()\n"
    "    output.copy_(y.to(output.dtype))\n"
)


def test_destination_passing_and_a_call_that_skips_its_work_while_timed(session_tmp):
    guard = make_guard(session_tmp / "ws-dps", static_screen=False, audits=3, min_iters=20, max_iters=20)
    try:
        honest = guard.evaluate(_dps_solution(DPS_HONEST), RMS, agent="dps")
        assert honest.status == "PASSED", honest.reason
        skips = guard.evaluate(_dps_solution(DPS_SKIPS), RMS, agent="dps-skip")
        # its outputs are poisoned before each audited timed call, so the skipped work shows
        assert skips.decision == "REJECT" and skips.status != "PASSED", skips.reason
        assert "tim" in skips.reason.lower(), skips.reason
    finally:
        guard.close()


def test_a_candidate_waiting_for_a_busy_guard_says_so(guard):
    """While the device's guard is busy (another evaluation, or baselines being prepared), a new
    candidate reports that it waits, then is judged once the guard is free."""
    import threading

    events: list[tuple[str, str]] = []
    result: dict = {}

    def judge():
        try:
            result["v"] = guard.evaluate(
                from_source(unique(honest_source()), None, "k.py"),
                RMS,
                agent="waiter",
                progress=lambda phase, done, total, msg="": events.append((phase, msg)),
            )
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            result["error"] = exc

    guard._lock.acquire()  # what a running evaluation or `serve --prepare` holds
    try:
        worker = threading.Thread(target=judge, daemon=True)
        worker.start()
        deadline = time.monotonic() + 300  # a deadline a loaded machine meets: only the order is checked
        while time.monotonic() < deadline and not any(p == "waiting" for p, _ in events):
            time.sleep(0.05)
        assert [m for p, m in events if p == "waiting"] == [
            "this device's guard is busy (another evaluation, or baselines being measured)"
        ]
        assert not result  # still waiting: judged only once the guard is free
    finally:
        guard._lock.release()
    worker.join(300)
    assert "v" in result, result.get("error", "no verdict within 300 s")
    assert result["v"].status == "PASSED", result["v"].reason


def test_an_honest_torch_compile_candidate_is_not_taken_for_a_patch(guard):
    """torch.compile imports torch._dynamo, which wraps torch.manual_seed on import: in a CPU
    worker that had not imported it, an honest candidate's first call read as a patch
    (REWARD_HACK). The worker settles dynamo before a candidate that names it is loaded."""
    source = unique(
        "import torch\n\n\n"
        "@torch.compile(backend='eager')\n"
        "def _rms(x, w):\n"
        "    x = x.float()\n"
        "    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()\n\n\n"
        "def run(hidden_states, weight):\n"
        "    return _rms(hidden_states, weight).to(hidden_states.dtype)\n"
    )
    v = guard.evaluate(from_source(source, None, "kernel.py"), RMS, agent="compiled")
    assert v.status == "PASSED", f"{v.status} {v.reason}\n{v.diagnostic}"


def test_a_worker_that_fails_to_set_up_is_the_guards_error_and_after_it_the_candidates(guard, monkeypatch):
    """The candidate's worker is set up for the problem before any of the candidate's code
    runs: an INTERNAL reply there is the guard's error, kept as the candidate's state (it used
    to reach the verdict model, which has no such status, and end in a validation error).
    From the build on, the candidate's code runs in the worker and could forge any reply, so
    an INTERNAL reply to ``prepare`` is the candidate's RUNTIME_ERROR."""
    from guard.cascade.reasons import GuardError
    from guard.runner.process import WorkerProcess

    honest_request = WorkerProcess.request

    def failing(op: str):
        def request(self, msg, *args, **kwargs):
            if self.role == "candidate" and msg.get("op") == op:
                return {"ok": False, "status": "INTERNAL", "message": "AttributeError: the worker's own step"}
            return honest_request(self, msg, *args, **kwargs)

        return request

    monkeypatch.setattr(WorkerProcess, "request", failing("setup"))
    with pytest.raises(GuardError, match="could not set up the problem"):
        guard.evaluate(from_source(honest_source(), None, "kernel.py"), RMS, agent="setup-fails")
    monkeypatch.setattr(WorkerProcess, "request", failing("prepare"))
    v = guard.evaluate(from_source(honest_source(), None, "kernel.py"), RMS, agent="prepare-fails")
    assert (v.status, v.gate) == ("RUNTIME_ERROR", "build"), v.reason
    assert "the worker's own step" in v.reason
