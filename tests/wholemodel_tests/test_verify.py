"""Plugging kernels into a model on the CPU: the end-to-end check catches a wrong kernel,
diagnose mode pins it down, unused kernels are reported, and the CLI ties profile, the
guard and verify together."""

from __future__ import annotations

import json
import time

import pytest

from guard.candidates.load import from_file
from guard.workspace import Workspace
from wholemodel.loader import load
from wholemodel.profile import profile_model
from wholemodel.sources import seed_sources
from wholemodel.verify import build_kernel, verify

from helpers import DATA, fast_workspace, kernelarc

MODELS = DATA / "wholemodel"


@pytest.fixture(scope="module")
def llama_bf16():
    return load("llama_block", device="cpu", dtype="bfloat16")


@pytest.fixture(scope="module")
def problems(llama_bf16, tmp_path_factory):
    """The model's problems, as `profile --top` writes them, by family."""
    from guard.problems.problem import load_problem
    from wholemodel.problems import write_problems

    out = tmp_path_factory.mktemp("problems")
    folders, _ = write_problems(profile_model(llama_bf16, reps=1, warmup=1), 10, out)
    return {p.definition.kernelarc.op_family: p for p in map(load_problem, folders)}


def _kernel(problems, family, file, tmp_path):
    return build_kernel(problems[family], from_file(MODELS / file), f"file {file}", "cpu", tmp_path)


def test_correct_kernels_pass_and_serve_every_call(llama_bf16, problems, tmp_path):
    kernels = [
        _kernel(problems, "rmsnorm", "rmsnorm_ok.py", tmp_path),
        _kernel(problems, "matmul", "matmul_ok.py", tmp_path),
        _kernel(problems, "swiglu_mlp", "swiglu_ok.py", tmp_path),
    ]
    v = verify(llama_bf16, kernels, reps=2, warmup=1)
    assert v.ok, v.total.check.message
    use = v.total.use
    assert use["llama_block_small_rmsnorm"].served == 2
    assert use["llama_block_small_swiglu_mlp"].served == 1
    assert use["llama_block_small_matmul"].served == 5  # q, k, v, o, down; gate/up are the SwiGLU kernel's
    assert v.total.check.plugged.rel_l2 <= v.total.check.limit_rel_l2
    assert v.total.own_ms > 0 and v.total.plugged_ms > 0
    assert all(u.own_s and u.kernel_s for u in use.values())  # per-kernel times measured at its calls


def test_wrong_kernel_fails_and_diagnose_names_it(llama_bf16, problems, tmp_path):
    kernels = [
        _kernel(problems, "matmul", "matmul_ok.py", tmp_path),
        _kernel(problems, "rmsnorm", "rmsnorm_wrong_eps.py", tmp_path),
    ]
    v = verify(llama_bf16, kernels, reps=1, warmup=0, diagnose=True)
    assert not v.ok and not v.total.check.ok
    assert "relative L2 error" in v.total.check.message
    alone = {t.kernels[0]: t.check.ok for t in v.alone}
    assert alone == {"llama_block_small_matmul": True, "llama_block_small_rmsnorm": False}


def test_kernel_for_other_constants_is_declined_and_reported(llama_bf16, tmp_path):
    """The shipped rmsnorm problem is for hidden size 4096: its kernel serves no call of a
    256-wide model, and verify says so instead of passing quietly."""
    ws = Workspace.open(tmp_path / "ws")
    from wholemodel.sources import from_kernel_file

    src = from_kernel_file(ws, f"rmsnorm_llama3_8b={MODELS / 'rmsnorm_ok.py'}")
    k = build_kernel(src.problem, src.solution, src.origin, "cpu", tmp_path)
    v = verify(llama_bf16, [k], reps=1, warmup=0)
    use = v.total.use["rmsnorm_llama3_8b"]
    assert use.served == 0 and use.declined == 2 and not v.ok


def test_destination_passing_solution(llama_bf16, problems, tmp_path):
    from guard.candidates.load import from_solution_json

    sol = from_solution_json(
        json.dumps(
            {
                "name": "rms-dps",
                "spec": {"languages": ["pytorch"], "entry_point": "k.py::run", "destination_passing_style": True},
                "sources": [
                    {
                        "path": "k.py",
                        "content": (
                            "import torch\n"
                            "def run(hidden_states, weight, output):\n"
                            "    x = hidden_states.float()\n"
                            "    output.copy_(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5)"
                            " * weight.float())\n"
                        ),
                    }
                ],
            }
        )
    )
    k = build_kernel(problems["rmsnorm"], sol, "dps", "cpu", tmp_path)
    v = verify(llama_bf16, [k], reps=1, warmup=0)
    assert v.ok and v.total.use["llama_block_small_rmsnorm"].served == 2


@pytest.mark.slow
def test_seed_triton_kernels_on_the_model(llama_bf16, tmp_path):
    """Every family's seed kernel, through Triton's interpreter, on the bf16 block."""
    srcs = seed_sources(profile_model(llama_bf16, reps=1, warmup=1))
    assert {s.problem.definition.kernelarc.op_family for s in srcs} == {
        "matmul",
        "swiglu_mlp",
        "attention",
        "rmsnorm",
        "rope",
    }
    kernels = [build_kernel(s.problem, s.solution, s.origin, "cpu", tmp_path) for s in srcs]
    v = verify(llama_bf16, kernels, reps=1, warmup=0)
    assert v.ok, v.total.check.message
    assert all(u.served > 0 for u in v.total.use.values())


@pytest.mark.slow
def test_seed_triton_kernels_on_the_float32_model(tmp_path):
    """The same in float32 (what `kernelarc verify --seeds triton` runs on a CPU): the seeds
    round to bfloat16 only where the model is in bfloat16, so they meet float32's accuracy."""
    model = load("llama_block", device="cpu", dtype="float32")
    srcs = seed_sources(profile_model(model, reps=1, warmup=1))
    kernels = [build_kernel(s.problem, s.solution, s.origin, "cpu", tmp_path) for s in srcs]
    v = verify(model, kernels, reps=1, warmup=0)
    assert v.ok, v.total.check.message
    assert all(u.served > 0 for u in v.total.use.values())


@pytest.mark.slow
def test_cli_profile_top_submit_and_verify_run(tmp_path, needs_bwrap):
    """profile --top writes and imports problems; the guard judges a kernel on one; a
    swarm run's best kernel is what verify --run plugs in."""
    ws = fast_workspace(tmp_path / "ws")
    # --top 4 of the block's five families: one noisy CPU profile once ranked matmul third of --top 2
    proc = kernelarc(
        ws,
        "profile",
        "llama_block",
        "--device",
        "cpu",
        "--reps",
        "1",
        "--top",
        "4",
        "--out",
        str(tmp_path / "probs"),
        "--json",
    )
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["model"] == "llama_block_small" and doc["entries"][0]["amdahl"]["x3"] > 1
    imported = doc["problems_imported"]
    assert "llama_block_small_matmul" in imported

    listed = json.loads(kernelarc(ws, "problems", "--json").stdout.strip().splitlines()[-1])
    assert set(imported) <= {p["name"] for p in listed["problems"]}

    from launcher.run import AgentSpec, RunConfig, RunFolder

    run_id = "20261129-000000-profile-test"
    RunFolder(ws, run_id).save(
        RunConfig(
            run_id=run_id,
            problem="llama_block_small_matmul",
            client="scripted",
            agents=[AgentSpec(name="a-run-1", strategy="a", client="scripted")],
            started_at=time.time() - 5,
        )
    )
    sub = kernelarc(
        ws,
        "submit",
        str(MODELS / "matmul_ok.py"),
        "--problem",
        "llama_block_small_matmul",
        "--agent",
        "a-run-1",
        "--device",
        "cpu",
        "--json",
    )
    assert json.loads(sub.stdout.strip().splitlines()[-1])["decision"] == "ACCEPT"

    # agents' kernels run in the guard's sandbox; in this process only when the user says so
    verify_run = ["verify", "llama_block", "--device", "cpu", "--run", run_id]
    refused = kernelarc(ws, *verify_run, "--in-process", check=False)
    assert refused.returncode == 2 and "--trust-agent-kernels" in refused.stderr
    assert "building" not in refused.stderr
    out = kernelarc(ws, *verify_run, "--reps", "2", "--markdown", str(tmp_path / "verify.md"))
    assert "PASSED" in out.stdout and f"run {run_id}" in out.stdout
    assert "ran in the sandbox (isolation: bubblewrap" in out.stdout
    assert "| llama_block_small_matmul |" in (tmp_path / "verify.md").read_text()
    trusted = kernelarc(ws, *verify_run, "--in-process", "--trust-agent-kernels", "--reps", "1", "--json")
    doc = json.loads(trusted.stdout.strip().splitlines()[-1])
    assert doc["ok"] and doc["ran"] == "in this process, without a sandbox"

    wrong = kernelarc(
        ws,
        "verify",
        "llama_block",
        "--device",
        "cpu",
        "--reps",
        "1",
        "--json",
        "--kernel",
        f"rmsnorm_llama3_8b={MODELS / 'rmsnorm_ok.py'}",
        check=False,
    )
    assert wrong.returncode == 1
    assert json.loads(wrong.stdout.strip().splitlines()[-1])["total"]["use"]["rmsnorm_llama3_8b"]["served"] == 0
    none = kernelarc(ws, "verify", "llama_block", "--device", "cpu", check=False)
    assert none.returncode == 2 and "no kernels" in none.stderr


def test_a_nan_the_model_itself_gives_is_no_bar():
    """``Errors.of`` leaves out what the high-precision run does not give as a number (a fully
    masked row's NaN); the bar on the largest error did not, and one NaN there failed every
    kernel against it."""
    import torch

    from wholemodel.accuracy import check

    ref = torch.linspace(-1, 1, 64, dtype=torch.float64)
    ref[5] = float("nan")
    out = ref.to(torch.bfloat16)
    result = check(out, out.clone(), ref, torch.bfloat16)
    assert result.ok, result.message
