"""Issue 7 on the GPU: profile the Llama-like block (and the GPT-2-like one), write its top
kernels as problems, and verify the block with the seed kernels plugged in, Triton and
CUDA, each kernel alone too. Every step is the real command line; its Markdown tables
and JSON land in OUT_DIR.

Usage: python -m benchmarks.model_bench OUT_DIR [--steps profile triton cuda]
       python -m benchmarks.model_bench --render OUT_DIR > docs/model_profile.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEVICE = "cuda"  # --device cpu: a dry run of the script here (small models, interpreter)

STEPS = {
    "profile": [
        ["profile", "llama_block", "--reps", "10", "--top", "6", "--no-import"],
        ["profile", "gpt2_block", "--reps", "10"],
    ],
    "triton": [["verify", "llama_block", "--seeds", "triton", "--diagnose", "--reps", "30"]],
    "cuda": [["verify", "llama_block", "--seeds", "cuda", "--diagnose", "--reps", "30"]],
}


def _cli(out: Path, scratch: Path, tag: str, args: list[str]) -> dict:
    md = out / f"{tag}.md"
    extra = ["--out", str(scratch / "problems")] if "--top" in args else []
    cmd = [
        sys.executable,
        "-m",
        "kernelarc_mcp.cli",
        "--workspace",
        str(scratch / "ws"),
        *args,
        *extra,
        "--device",
        DEVICE,
        "--markdown",
        str(md),
    ]
    t0 = time.time()
    text = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    # one text file for every step: the device machine returns at most 8 files per call
    with (out / "model_bench_output.txt").open("a") as f:
        f.write(f"===== {tag}: {' '.join(cmd[3:])}\n{text.stdout}\n--- stderr ---\n{text.stderr[-8000:]}\n")
    return {
        "tag": tag,
        "command": "kernelarc " + " ".join(args + ["--device", DEVICE]),
        "rc": text.returncode,
        "seconds": round(time.time() - t0, 1),
        "markdown": md.name if md.exists() else None,
    }


def run(out: Path, steps: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
    except FileNotFoundError:
        smi = "none (CPU dry run)"
    log = {"date": dt.date.today().isoformat(), "gpu": smi, "runs": []}
    scratch = Path(tempfile.mkdtemp(prefix="model-bench-"))  # workspace and problems, kept out of OUT
    for step in steps:
        for args in STEPS[step]:
            tag = f"{step}_{args[1]}" if step == "profile" else f"verify_{step}"
            entry = _cli(out, scratch, tag, args)
            log["runs"].append(entry)
            print(json.dumps(entry), flush=True)
            (out / "model_bench.json").write_text(json.dumps(log, indent=2))
    if (scratch / "problems").is_dir():  # the problems written by --top, as one file
        with tarfile.open(out / "problems.tar.gz", "w:gz") as tar:
            tar.add(scratch / "problems", arcname="problems")


def render(out: Path) -> str:
    log = json.loads((out / "model_bench.json").read_text())
    lines = [
        f"# Whole-model profile and verification on the H200 ({log['date']})",
        "",
        f"GPU: {log['gpu']}. Produced by `python -m benchmarks.model_bench OUT` (one device call, "
        "`benchmarks/gpu_call.sh`); raw output in `docs/results/" + log["date"] + "/model_bench/`.",
        "",
    ]
    for r in log["runs"]:
        lines += [f"## `{r['command']}`", "", f"exit status {r['rc']}, {r['seconds']} s", ""]
        if r["markdown"] and (out / r["markdown"]).exists():
            lines += [(out / r["markdown"]).read_text().strip(), ""]
        else:
            lines += ["(no tables came back from this step: see the text output)", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    ap.add_argument("--render", action="store_true")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if args.render:
        sys.stdout.write(render(args.out))
        return 0
    run(args.out, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
