"""``kernelarc demo``: judge the shipped seed kernel of a shipped problem, then a subtly
wrong variant of it, and show the leaderboard. Runs on the GPU when there is one, else on
the CPU (Triton through its interpreter, CPU-sized workloads)."""

from __future__ import annotations

import sys

from . import render

DEMO_PROBLEM = "rmsnorm_llama3_8b"
DEMO_AGENT = "demo"


def _faulty_variant(source: str) -> str:
    """The seed without its epsilon: right on ordinary inputs, wrong near zero."""
    return source.replace("/ n_cols + eps)", "/ n_cols)").replace(
        "A fair starting point", "A variant that forgot eps. A fair starting point"
    )


def run_demo(args) -> int:
    from guard.candidates.load import from_source
    from guard.leaderboard import leaderboard
    from guard.pipeline import Guard
    from guard.workspace import Workspace

    ws = Workspace.open(args.workspace)
    problem = ws.problems().get(DEMO_PROBLEM)
    seed_path = problem.seed_kernels()["seed_triton.py"]
    seed = seed_path.read_text()
    out = sys.stdout
    results = []
    with Guard(ws, ws.config(), device=args.device) as guard:
        guard.warm_up()
        dev = guard.device
        print(f"KernelArc demo on {dev.kind} ({dev.name}); workspace {ws.root}", file=out)
        print(f"problem {problem.name}: {problem.definition.description}", file=out)
        if dev.kind == "cpu":
            print("No GPU here: Triton runs in its interpreter on CPU-sized workloads, so the "
                  "times show the pipeline at work, not kernel speed.", file=out)
        print(file=out)
        steps = [
            ("the shipped Triton seed kernel", seed, "seed kernel"),
            ("the seed with eps forgotten (passes ordinary inputs)", _faulty_variant(seed), "no eps"),
        ]
        for i, (title, source, notes) in enumerate(steps, 1):
            print(f"== {i}. submitting {title}", file=out)
            progress = render.ProgressLine()
            try:
                v = guard.evaluate(
                    from_source(source, "triton", "kernel.py"), problem.name,
                    agent=DEMO_AGENT, notes=notes, progress=progress,
                )
            finally:
                progress.finish()
            results.append(v)
            if not args.json:
                render.verdict(v, out)
                print(file=out)
        board = leaderboard(guard.db, problem.name, device_key=dev.key)
    if args.json:
        import json

        out.write(json.dumps({"verdicts": [v.model_dump(mode="json") for v in results], "leaderboard": board}) + "\n")
        return 0
    print("== leaderboard", file=out)
    render.table(
        ["agent", "candidate", "SOL score", "x eager", "x compile", "latency", ""],
        [[e["agent"], e["candidate_id"], e["score"], e["speedup_eager"], e["speedup_compile"],
          render.ms(e["latency_ms"]), "global best" if e["is_global_best"] else ""] for e in board["agents"]],
        out,
    )
    print("\nNext: `kernelarc problems`, `kernelarc submit FILE --problem NAME`, "
          "`kernelarc leaderboard --problem NAME`.", file=out)
    return 0
