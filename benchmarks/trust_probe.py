"""What the guard's run-time defences see on a GPU (run on the H200; results in docs/).

1. The machine: kernel, and the isolation the guard gets (bubblewrap or none, and why).
2. Honest candidates (the Triton and CUDA C++ seeds of several problems, plain PyTorch, a CUDA
   kernel launched on the legacy default stream beside the same kernel on the current
   stream): verdict, per workload the inside figure, the outside clock's figure, the loop's
   own cost and the method. The excess of outside over inside on honest code is what the
   outside clock's band must allow; it is reported per workload so the band can be set from it.
3. Every cheat in tests/cheats with the static screen off: what the guard says.

The guard runs with the outside clock's band opened wide in part 2 (so that the excess is
measured, not judged) and with the configured band in part 3.

Usage: python -m benchmarks.trust_probe OUT_DIR [--only honest|cheats] [--device cuda]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import CHEATS, RMS, expectation, fast_config, honest_source, submit_cheat, unique  # noqa: E402
from guard.candidates.load import from_source  # noqa: E402
from guard.cascade import Guard  # noqa: E402
from guard.workspace import Workspace  # noqa: E402
from seeds import SEEDS_DIR  # noqa: E402

log = logging.getLogger("trust_probe")
HONEST_PROBLEMS = ("rmsnorm_llama3_8b", "softmax_lm_vocab_fp32", "matmul_bf16_llm_projections", "rope_llama_bf16")
CURRENT_STREAM = "<<<n_rows, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>"


def default_stream_variant(source: str) -> str:
    """The RMSNorm CUDA seed as most CUDA programmers write a launch: no stream, no check."""
    assert CURRENT_STREAM in source
    return source.replace(CURRENT_STREAM, "<<<n_rows, THREADS>>>").replace("C10_CUDA_KERNEL_LAUNCH_CHECK();", "")


def summarize_verdict(name: str, v, wall: float) -> dict:
    rows = []
    for w in v.workloads:
        t = w.timing.model_dump() if w.timing is not None else {}
        oc = t.get("outside_clock") or {}
        rows.append(
            {
                "workload": w.uuid,
                "latency_us": (w.latency_ms or 0) * 1e3,
                "method": t.get("method"),
                "event_mean_us": (t.get("event_mean_ms") or 0) * 1e3,
                "outside_us": oc.get("outside_ms", 0) * 1e3,
                "inside_us": oc.get("inside_ms", 0) * 1e3,
                "loop_us": oc.get("loop_wall_s", 0) / max(1, oc.get("loop_iters", 1)) * 1e6,
                "pad_us": (t.get("pad_ms") or 0) * 1e3,
                "iters": t.get("n"),
                "graph_error": t.get("graph_error"),
                "excess_us": (oc.get("outside_ms", 0) - oc.get("inside_ms", 0)) * 1e3,
                "loop": oc.get("loop"),
                "confirm_pad_us": (oc.get("pad_ms") or 0) * 1e3,
                "band_us": (oc.get("inside_ms", 0) * oc.get("rel_band", 0) + oc.get("abs_band_ms", 0)) * 1e3,
            }
        )
    return {
        "name": name,
        "decision": v.decision,
        "status": v.status,
        "gate": v.gate,
        "reason": v.reason,
        "diagnostic": (v.diagnostic or "")[:600],
        "wall_s": wall,
        "isolation": getattr(v.device, "isolation", None),
        "workloads": rows,
    }


def submit(guard, name, source, language, problem, filename="kernel.py") -> dict:
    t0 = time.monotonic()
    v = guard.evaluate(from_source(source, language, filename), problem, agent=name)
    rec = summarize_verdict(name, v, time.monotonic() - t0)
    print(f"{name:40s} {v.decision:7s} {v.status:20s} {rec['wall_s']:6.1f}s {(v.reason or '')[:160]}", flush=True)
    for r in rec["workloads"]:
        print(
            f"    {r['workload']:30s} {r['method'] or '':21s} in {r['latency_us']:8.2f} ev {r['event_mean_us']:8.2f} "
            f"out {r['outside_us']:8.2f} excess {r['excess_us']:7.2f} loop {r['loop_us']:7.1f} "
            f"pad {r['confirm_pad_us']:6.1f} band {r['band_us']:6.2f} {r['loop']} n {r['iters']}",
            flush=True,
        )
    return rec


def honest_part(root: Path, device: str, problems=HONEST_PROBLEMS) -> list[dict]:
    cfg = fast_config(
        min_iters=50,
        max_iters=200,
        target_time_s=0.05,
        warmup_time_s=0.05,
        call_timeout_s=120,
        outside_rel_band=100.0,
        outside_abs_band_ms=100.0,
        outside_loop_slack=100.0,
    )
    out = []
    with Guard(Workspace.open(root / "ws-honest"), cfg, device=device) as g:
        out.append(submit(g, "torch-rmsnorm", honest_source(), None, RMS))
        cuda_src = (SEEDS_DIR / RMS / "seed_cuda.cu").read_text()
        out.append(submit(g, "cuda-current-stream", unique(cuda_src, "//"), "cuda_cpp", RMS, "kernel.cu"))
        out.append(
            submit(
                g, "cuda-default-stream", unique(default_stream_variant(cuda_src), "//"), "cuda_cpp", RMS, "kernel.cu"
            )
        )
        for problem in problems:
            src = (SEEDS_DIR / problem / "seed_triton.py").read_text()
            out.append(submit(g, f"triton-{problem}", unique(src), "triton", problem))
    return out


def cheats_part(root: Path, device: str, patterns=("*",)) -> list[dict]:
    cfg = fast_config(min_iters=20, max_iters=100, target_time_s=0.02, static_screen=False, call_timeout_s=30)
    out = []
    with Guard(Workspace.open(root / "ws-cheats"), cfg, device=device) as g:
        paths = {p for pat in patterns for p in CHEATS.glob(pat) if p.suffix in (".py", ".cu")}
        for path in sorted(paths):
            if path.name == "honest_torch.py":
                continue
            exp = expectation(path)
            try:
                t0 = time.monotonic()
                v = submit_cheat(g, path, path.stem)
                rec = summarize_verdict(path.stem, v, time.monotonic() - t0)
                print(
                    f"{path.stem:40s} {v.decision:7s} {v.status:20s} {rec['wall_s']:6.1f}s {(v.reason or '')[:160]}",
                    flush=True,
                )
            except Exception as exc:  # noqa: BLE001 - the probe reports, it does not stop
                rec = {"name": path.stem, "error": f"{type(exc).__name__}: {exc}"[:500]}
                print(f"{path.stem:40s} ERROR {rec['error']}", flush=True)
            rec["expected_runtime"] = exp.get("runtime")
            out.append(rec)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", choices=["honest", "cheats"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--problems", nargs="*", default=list(HONEST_PROBLEMS), help="problems of the Triton seeds")
    ap.add_argument("--cheats", nargs="*", default=["*"], help="glob patterns of cheats in tests/cheats")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    from guard.sandbox import isolation_line

    result = {"date": dt.date.today().isoformat(), "kernel": platform.release(), "isolation": isolation_line()}
    print(f"kernel {result['kernel']}; {result['isolation']}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="trust-probe-"))
    if args.only in (None, "honest"):
        result["honest"] = honest_part(root, args.device, args.problems)
        (args.out / "trust_probe.json").write_text(json.dumps(result, indent=1))
    if args.only in (None, "cheats"):
        result["cheats"] = cheats_part(root, args.device, args.cheats)
    (args.out / "trust_probe.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
