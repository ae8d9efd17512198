"""GPU tests of the run-time trust defences (run on the H200: ``pytest -m gpu tests/gpu``):
an honest CUDA kernel launched on the legacy default stream is timed, never accused, and the
guard's workers are isolated. The cheats, GPU-only ones included, are in test_gpu_guard.py."""

from __future__ import annotations

import statistics

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from guard.candidates.load import from_source  # noqa: E402
from guard.cascade import Guard  # noqa: E402
from guard.workspace import Workspace  # noqa: E402
from seeds import SEEDS_DIR  # noqa: E402

from helpers import RMS, fast_config, unique  # noqa: E402

CURRENT_STREAM = "<<<n_rows, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>"


@pytest.fixture(scope="module")
def trust_guard(session_tmp):
    g = Guard(Workspace.open(session_tmp / "gpu-trust"),
              fast_config(min_iters=50, max_iters=300, target_time_s=0.05, call_timeout_s=60), device="cuda")
    yield g
    g.close()


def test_default_stream_kernel_is_timed_like_the_same_kernel_on_the_current_stream(trust_guard):
    """NVIDIA's honest flux_rope solution was once rejected as REWARD_HACK: its `<<<grid,
    block>>>` launch on the legacy default stream is not captured in a graph. The graph must
    be found not to hold the work, and the kernel timed without one."""
    src = (SEEDS_DIR / RMS / "seed_cuda.cu").read_text()
    assert CURRENT_STREAM in src
    default = src.replace(CURRENT_STREAM, "<<<n_rows, THREADS>>>").replace("C10_CUDA_KERNEL_LAUNCH_CHECK();", "")
    cur = trust_guard.evaluate(from_source(unique(src, "//"), "cuda_cpp", "kernel.cu"), RMS, agent="current")
    dft = trust_guard.evaluate(from_source(unique(default, "//"), "cuda_cpp", "kernel.cu"), RMS, agent="default")
    assert cur.status == "PASSED", cur.reason
    assert dft.status == "PASSED", f"{dft.reason}\n{dft.diagnostic}"
    assert all(w.timing.method == "cuda-events+host-sync" for w in dft.workloads)
    assert all(w.timing.graph_error for w in dft.workloads)  # why no graph: it is said
    # kernels long enough that launch effects are small: within a few percent (on 2026-12-01,
    # before eager calls were timed by their CUPTI spans, this read 1.17x at 8192 tokens)
    ratios = [d.latency_ms / c.latency_ms for c, d in zip(cur.workloads, dft.workloads) if c.latency_ms > 0.04]
    assert ratios, "no workload long enough to compare"
    assert abs(statistics.median(ratios) - 1) < 0.05, ratios


def test_verdicts_say_how_workers_are_isolated(trust_guard):
    info = trust_guard.device_info()
    assert str(info.get("isolation", "")).startswith("isolation: bubblewrap"), info
