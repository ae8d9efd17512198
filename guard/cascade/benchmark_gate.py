"""Gate 4: timing the visible workloads (held-out ones are never timed), with the outputs
of randomly chosen timed calls checked against the reference; and the paired
re-measurement of an incumbent and the challenger, timed turn about on the same inputs.
The timing itself runs in the workers (guard/runner/timing.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from ..paths import cache_dir
from ..problems.schema import Definition, Workload
from ..runner.pool import WorkerPool
from ..runner.process import WorkerDied, WorkerProcess, WorkerTimeout
from .context import EvalContext
from .reasons import Rejection, Unpaired, first_line
from .reference_side import ReferenceSide


def time_workload(ref: ReferenceSide, worker: WorkerProcess, trusted: WorkerProcess, key: str, d: Definition,
                  w: Workload, sets, audit_at, outdir: Path, tag: str) -> dict:
    """Time one workload in ``worker``; the outputs of the audited timed calls are
    checked against the reference (a candidate may not behave differently when timed)."""
    axes = d.resolve_axes(w.axes)
    reply = worker.request({
        "op": "time", "workload": w.model_dump(mode="json"), "axes": axes, "sets": sets,
        "audit_at": audit_at, "config": ref.timing_config(), "outdir": str(outdir),
        "gpu_uuid": ref.device.uuid,
    }, ref.cfg.call_timeout_s + ref.cfg.max_timing_s)
    if not reply.get("ok"):
        raise Rejection("benchmark", reply.get("status", "RUNTIME_ERROR"),
                        f"{reply.get('status')} while timing {w.uuid}: {first_line(reply.get('message', ''))}",
                        reply.get("message"), w.uuid)
    names = list(d.outputs)
    tolerances = [d.tolerance_for(s.dtype).model_dump() for s in d.outputs.values()]
    for audit in reply.get("audits", []):
        atag = f"{tag}-audit{audit['iteration']}"
        ref.request(trusted, {
            "op": "reference", "key": key, "workload": w.model_dump(mode="json"), "axes": axes,
            "rounds": [{"seed": sets[audit["set"]], "kind": "normal", "tag": atag}],
        })
        cmp = ref.request(trusted, {
            "op": "compare", "tag": atag, "outputs": audit["outputs"],
            "tolerances": tolerances, "names": names,
        })
        for meta in audit["outputs"]:
            Path(meta["file"]).unlink(missing_ok=True)
        if not cmp.get("passed"):
            raise Rejection(
                "benchmark", "REWARD_HACK",
                f"a timed call on {w.uuid} returned a wrong result: the candidate behaves differently while timed",
                cmp.get("message"), w.uuid,
            )
    return {"stats": reply["stats"], "nvml": reply.get("nvml")}


def benchmark(ctx: EvalContext) -> dict:
    """workload uuid -> {"stats": ..., "nvml": ...} for the visible workloads."""
    ref, cfg, d, visible, progress = ctx.ref, ctx.cfg, ctx.definition, ctx.visible, ctx.progress
    rng = random.Random(ctx.eval_seed)
    results = {}
    with ref.hold(True, progress):
        for i, w in enumerate(visible):
            progress("benchmark", i, len(visible), w.uuid)
            sets = ref.set_seeds(d, w, "timing", ctx.eval_seed)
            audit_at = [rng.randrange(0, cfg.max_iters) for _ in range(cfg.audits)]
            results[w.uuid] = time_workload(ref, ctx.cand, ctx.trusted, ctx.key, d, w, sets, audit_at,
                                            ctx.outdir, f"w{i}")
    progress("benchmark", len(visible), len(visible), "timed")
    return results


def remeasure(ctx: EvalContext, pool: WorkerPool, incumbent, rounds: int = 2) -> dict:
    """Time the incumbent (a stored candidate row) and the challenger turn about (I C C I ...)
    on the same inputs, each worker writing to its own folder. Returns workload -> paired
    samples, or raises Unpaired when the incumbent cannot be run again (then the stored
    measurement decides)."""
    ref, cfg, problem, visible, progress = ctx.ref, ctx.cfg, ctx.problem, ctx.visible, ctx.progress
    d = problem.definition
    inc = pool.take_candidate()
    try:
        inc.wait_ready(180)
        reply = inc.request(
            {"op": "prepare", "definition": d.to_json(), "solution": json.loads(incumbent["solution_json"]),
             "language": incumbent["language"], "blob_root": str(problem.root) if problem.root else None,
             "build_cache": str(cache_dir() / "torch_extensions")},
            cfg.build_timeout_s,
        )
        if not reply.get("ok"):
            raise Unpaired(f"the incumbent {incumbent['id']} does not build here: {first_line(reply.get('message', ''))}")
        outdirs = {"incumbent": inc.outdir, "challenger": ctx.outdir}
        rng = random.Random(ctx.eval_seed ^ 0x5A5A)
        samples: dict[str, dict] = {}
        with ref.hold(True, progress):
            for i, w in enumerate(visible):
                progress("pairing", i, len(visible), f"{w.uuid} against {incumbent['id']}")
                sets = ref.set_seeds(d, w, "pairing", ctx.eval_seed)
                s = samples[w.uuid] = {"incumbent": [], "challenger": []}
                for rep in range(rounds):
                    order = [("incumbent", inc), ("challenger", ctx.cand)]
                    for role, worker in (order if rep % 2 == 0 else order[::-1]):
                        audit_at = [rng.randrange(0, cfg.max_iters)] if role == "challenger" and rep == 0 else []
                        try:
                            t = time_workload(ref, worker, ctx.trusted, ctx.key, d, w, sets, audit_at,
                                              outdirs[role], f"p{i}{role[0]}{rep}")
                        except Rejection as rej:
                            if role == "challenger":
                                raise
                            raise Unpaired(f"the incumbent failed to run again: {rej.reason}") from None
                        s[role].append((t["stats"]["median_ms"], t["stats"].get("rel_se") or 0.0))
        progress("pairing", len(visible), len(visible), "paired")
        return samples
    except (WorkerDied, WorkerTimeout) as exc:
        raise Unpaired(f"re-measuring {incumbent['id']} failed: {exc}") from None
    finally:
        pool.discard(inc)
