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
    g = Guard(
        Workspace.open(session_tmp / "gpu-trust"),
        fast_config(min_iters=50, max_iters=300, target_time_s=0.05, call_timeout_s=60),
        device="cuda",
    )
    yield g
    g.close()


# two CUDA C++ builds (75-90 s each on the lent machines) and their timing: a call's
# --timeout 150 cut it in the second build (session 44); it took 178 s whole
@pytest.mark.timeout(420)
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
    assert all(w.timing.method == "cuda-events+cupti" for w in dft.workloads), [w.timing.method for w in dft.workloads]
    assert all(w.timing.graph_error for w in dft.workloads)  # why no graph: it is said
    # every workload, the 1-token one of a few microseconds too (on 2026-12-01, before eager
    # calls were timed by their CUPTI spans, this read 1.17x at 8192 tokens and 1.6x at 1)
    ratios = [d.latency_ms / c.latency_ms for c, d in zip(cur.workloads, dft.workloads)]
    print("default/current per workload:", [round(r, 3) for r in ratios])
    assert abs(statistics.median(ratios) - 1) < 0.05, ratios
    # a workload off (2.90x on one of 14 on the H100 in session 37): what decided its figure
    off = "\n".join(
        f"  {d.uuid}: {r:.2f}x, default {_figures(d)}; current {_figures(c)}"
        for c, d, r in zip(cur.workloads, dft.workloads, ratios)
        if abs(r - 1) >= 0.15
    )
    assert not off, f"default/current beyond 15%:\n{off}"


def _figures(w) -> str:
    t, oc = w.timing, w.timing.outside_clock
    floored = bool(getattr(t, "floored_by_outside_clock", False))  # a field the guard adds, not declared
    line = f"decided {w.latency_ms * 1e3:.1f} us by {t.method}, floored {floored}"
    if oc is not None:
        line += (
            f", inside {oc.inside_ms * 1e3:.1f} us, outside {oc.outside_ms * 1e3:.1f} us, "
            f"host-bound {oc.host_bound}, windows {oc.windows}, loop {oc.loop}, pad {oc.pad_ms * 1e3:.0f} us"
        )
    return line


def test_outside_clock_loop_draws_fresh_inputs_in_graphs():
    """The outside clock's loop on a GPU: draws captured in a graph give new values on every
    replay and for every seed, and a second loop replaying the same draws (the trusted
    worker's check) sees the same inputs."""
    from guard.runner import replays
    from guard.runner.confirm import ConfirmLoop
    from guard.runner.inputs import InputMaker
    from guard.runner.refill import Refiller

    d = {
        "name": "scale",
        "reference": "def run(x):\n    return x * 2\n",
        "inputs": {"x": {"shape": ["n", 256], "dtype": "bfloat16"}},
        "outputs": {"y": {"shape": ["n", 256], "dtype": "bfloat16"}},
    }
    maker = InputMaker(d, "cuda")

    def loop(static=None):
        sets = [maker.make({}, {"n": 8}, seed=s) for s in (1, 2)]
        return sets, ConfirmLoop(
            "cuda", sets, Refiller(maker, {}, {"n": 8}), static, 16, lambda ms: None, projection_seed=5
        )

    sets, a = loop([[torch.empty(8, 256, dtype=torch.bfloat16, device="cuda")] for _ in range(2)])
    assert a.graph_refill and len(a.refill_graphs) == 2
    table = a.run(seed=5, iters=6, call=lambda k: [sets[k][0] * 2], pad_passes=1)
    other = a.run(seed=6, iters=6, call=lambda k: [sets[k][0] * 2], pad_passes=1)
    assert table != other and len({round(r[0][3], 6) for r in table}) == 6
    _, b = loop()
    projection = replays.Projection(5)
    for it, args in b.inputs_at(5, [0, 1, 4, 5]):
        values, allow = replays.digest_bounds(args[0] * 2, 1e-2, 1e-2, projection, call=it)
        assert replays.digest_mismatch(table[it][0], values, allow, "y") is None, it


def test_integer_and_offset_draws_capture_in_a_graph():
    """Indices and offsets are redrawn on every timed call too (``runner/refill.py``): their
    draws (``random_``, a cumulative sum) capture in the loop's refill graph, every replay
    gives new values by the maker's conventions, and a second loop replaying the same draws
    (the trusted worker's check) sees the same inputs."""
    from guard.runner.confirm import ConfirmLoop
    from guard.runner.inputs import InputMaker
    from guard.runner.refill import Refiller

    d = {
        "name": "gather_pages",
        "reference": "def run(x, kv_indptr, kv_indices):\n    return x[kv_indices.long()].sum(0)\n",
        "inputs": {
            "x": {"shape": ["num_pages", 8], "dtype": "float32"},
            "kv_indptr": {"shape": ["n_ptr"], "dtype": "int32"},
            "kv_indices": {"shape": ["n_idx"], "dtype": "int32"},
        },
        "outputs": {"y": {"shape": [8], "dtype": "float32"}},
    }
    axes = {"num_pages": 7, "n_idx": 5000, "n_ptr": 65}
    maker = InputMaker(d, "cuda")

    def loop():
        sets = [maker.make({}, axes, seed=s) for s in (1, 2)]
        return sets, ConfirmLoop("cuda", sets, Refiller(maker, {}, axes), None, 16, lambda ms: None)

    sets, a = loop()
    assert a.graph_refill and len(a.refill_graphs) == 2
    seen = []
    for it, args in a.inputs_at(9, [0, 1, 2, 3]):
        ptr, idx = args[1].cpu(), args[2].cpu()
        assert int(ptr[0]) == 0 and int(ptr[-1]) == 5000 and bool((ptr.diff() >= 0).all()), it
        assert 0 <= int(idx.min()) and int(idx.max()) < 7, it
        seen.append((ptr, idx))
    assert not torch.equal(seen[0][1], seen[2][1]) and not torch.equal(seen[0][0], seen[2][0])
    _, b = loop()
    for (it, args), (ptr, idx) in zip(b.inputs_at(9, [0, 1, 2, 3]), seen):
        assert torch.equal(args[1].cpu(), ptr) and torch.equal(args[2].cpu(), idx), it


def test_verdicts_say_how_workers_are_isolated(trust_guard):
    info = trust_guard.device_info()
    assert str(info.get("isolation", "")).startswith("isolation: bubblewrap"), info


def test_free_blocks_read_as_poison_without_growing_the_pool():
    """What a freed tensor held is poison by the next allocation of its size, and poisoning
    reserves nothing more (it writes the free blocks in place)."""
    from guard.runner.poison import POISON_BYTE, poison_free_blocks

    device = torch.device("cuda")
    answer = torch.full((64 << 20,), 7, dtype=torch.uint8, device=device)
    small = torch.full((4096,), 7, dtype=torch.uint8, device=device)
    del answer, small
    reserved = torch.cuda.memory_reserved()
    assert poison_free_blocks(device) >= (64 << 20) + 4096
    assert torch.cuda.memory_reserved() == reserved
    again = torch.empty((64 << 20,), dtype=torch.uint8, device=device)
    again_small = torch.empty((4096,), dtype=torch.uint8, device=device)
    assert bool((again == POISON_BYTE).all()) and bool((again_small == POISON_BYTE).all())


def test_a_block_whose_free_waits_on_another_stream_is_poisoned_too():
    """``record_stream`` defers a free until that stream's work is done: the block is listed
    as pending, not free, until the allocator's next allocation. Poisoning makes one first."""
    from guard.runner.poison import POISON_BYTE, poison_free_blocks

    device = torch.device("cuda")
    side = torch.cuda.Stream()
    answer = torch.full((32 << 20,), 7, dtype=torch.uint8, device=device)
    answer.record_stream(side)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy past the free
    del answer
    poison_free_blocks(device)
    again = torch.empty((32 << 20,), dtype=torch.uint8, device=device)
    assert bool((again == POISON_BYTE).all())


def test_outputs_poisoned_in_place_read_as_poison():
    from guard.runner.poison import poison_in_place

    device = torch.device("cuda")
    outs = [
        torch.ones(5, device=device),
        torch.ones(5, dtype=torch.int32, device=device),
        torch.ones(5, dtype=torch.uint8, device=device),
        torch.zeros(5, dtype=torch.bool, device=device)[1:],
    ]
    poison_in_place(outs)
    assert bool(outs[0].isnan().all()) and bool((outs[1] == -1).all()) and bool((outs[2] == 255).all())
    assert bool(outs[3].all())
