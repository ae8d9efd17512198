"""Gate 3: correctness on every visible workload (random and adversarial rounds, the first
run twice for determinism) and the held-out ones, whose shapes a reason never shows. The
candidate worker writes its outputs to files; the trusted worker compares them with the
reference."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypedDict

from ..config import GuardConfig
from ..problems import tolerance as tolerance_mod
from ..problems.derive import largest_tensor
from ..problems.schema import Definition, Workload
from ..verdict import Checked
from . import memory_plan
from .context import EvalContext
from .reasons import GuardError, Rejection, first_line

log = logging.getLogger(__name__)

ROUND_LABEL = {
    "normal": "random inputs",
    "mixed": "mixed scales (1e-3..1e3 per row)",
    "large": "large magnitudes",
    "tiny": "values near zero",
}

# Why a round other than plain random inputs is KernelArc's own check (SOL-ExecBench draws
# random inputs only): named in a rejection, so that a user of that benchmark sees why a kernel
# it passes is refused here.
ROUND_WHY = {
    "mixed": "KernelArc's mixed-scale round, stricter than SOL-ExecBench (random inputs only): "
    "rows of very different magnitude must each be right",
    "large": "KernelArc's large-magnitude round, stricter than SOL-ExecBench (random inputs only): "
    "no overflow where the reference stays finite",
    "tiny": "KernelArc's near-zero round, stricter than SOL-ExecBench (random inputs only): "
    "constants such as eps and small values must match the reference",
}

ADVERSARIAL_MAX_ELEMENTS = 1 << 24


class PlannedRound(TypedDict):
    """One round of inputs, as the trusted and the candidate worker are asked for it."""

    seed: int
    kind: str  # a key of ROUND_LABEL
    tag: str


def rounds(cfg: GuardConfig, d: Definition, w: Workload, visible: bool) -> list[str]:
    """The kinds of input of each round on ``w``."""
    kinds = ["normal"] * (cfg.correctness_rounds if visible else cfg.heldout_rounds)
    # Adversarial values test numerics, not size: the largest workloads (whose outputs
    # dominate the transfer time) get the random rounds only.
    if cfg.adversarial_rounds and d.kernelarc.adversarial and largest_tensor(d, w.axes) <= ADVERSARIAL_MAX_ELEMENTS:
        kinds += ["mixed", "large", "tiny"] if visible else ["mixed"]
    return kinds


def batches(cfg: GuardConfig, d: Definition, w: Workload, planned: list[PlannedRound]) -> list[list[PlannedRound]]:
    """The rounds of ``w`` in groups judged together. The trusted worker holds the reference
    outputs of one group until they are compared, so a group holds as many rounds as fit in
    ``held_rounds_bytes`` of outputs, and at least one: a large workload goes a round at a time."""
    per_round = max(1, memory_plan.tensor_bytes(d, w)[1])
    size = max(1, cfg.held_rounds_bytes // per_round)
    return [planned[i : i + size] for i in range(0, len(planned), size)]


def check(ctx: EvalContext) -> Checked:
    """Run the rounds; the verdict's ``checked`` on success, a ``Rejection`` otherwise."""
    ref, cfg, d, wset, progress = ctx.ref, ctx.cfg, ctx.definition, ctx.wset, ctx.progress
    plan = [(w, True, w.uuid) for w in wset.visible] + [
        (w, False, f"held-out workload {i + 1} of {len(wset.heldout)}") for i, w in enumerate(wset.heldout)
    ]
    tally = {"rounds": 0, "skipped": 0}
    errors: dict[str, dict[str, Any]] = {}
    for idx, (w, visible, label) in enumerate(plan):
        progress("correctness", idx, len(plan), label)
        planned: list[PlannedRound] = [
            {"seed": ref.seed("round", ctx.eval_seed, w.uuid, r), "kind": kind, "tag": f"w{idx}r{r}"}
            for r, kind in enumerate(rounds(cfg, d, w, visible))
        ]
        determinism = cfg.check_determinism and visible
        for group in batches(cfg, d, w, planned):
            # the first round judged on a visible workload also runs twice (determinism)
            if judge_rounds(ctx, w, visible, label, group, determinism, tally, errors):
                determinism = False
    progress("correctness", len(plan), len(plan), "all workloads passed")
    return Checked(
        visible_workloads=len(wset.visible),
        heldout_workloads=len(wset.heldout),
        rounds=tally["rounds"],
        rounds_skipped=tally["skipped"],
        determinism=cfg.check_determinism,
        errors=errors,
    )


def judge_rounds(
    ctx: EvalContext,
    w: Workload,
    visible: bool,
    label: str,
    planned: list[PlannedRound],
    determinism: bool,
    tally: dict[str, int],
    errors: dict[str, dict[str, Any]],
) -> bool:
    """One group of rounds of ``w``: the reference's outputs made (and held by the trusted
    worker), the candidate's made and written, each round compared and its reference outputs
    let go. Whether any round was judged; a ``Rejection`` when one fails."""
    ref, cfg, d, trusted = ctx.ref, ctx.cfg, ctx.definition, ctx.trusted
    names = list(d.outputs)
    axes = d.resolve_axes(w.axes)
    per_output = list(tolerance_mod.for_workload(d, w).values())
    tolerances = [t.message() for t in per_output]
    made = ref.request(
        trusted,
        {
            "op": "reference",
            "key": ctx.key,
            "workload": w.model_dump(mode="json"),
            "axes": axes,
            "rounds": planned,
            "chunk_elements": cfg.compare_chunk_elements,
        },
    )
    kept = []
    for rnd, info in zip(planned, made.get("rounds", [])):
        if not info.get("ok"):
            if visible and ref.device.kind != "cpu" and rnd["kind"] == "normal":
                raise GuardError(f"problem {d.name}: the reference fails on {w.uuid}: {info.get('message')}")
            log.warning("reference failed on %s (%s): %s; round skipped", label, rnd["kind"], info.get("message"))
            tally["skipped"] += 1
            continue
        if rnd["kind"] != "normal" and not info.get("finite"):
            tally["skipped"] += 1  # the op does not allow these values: the reference overflows
            ref.request(trusted, {"op": "release", "tags": [rnd["tag"]]})
            continue
        kept.append(rnd)
    if not kept:
        return False
    with ref.hold(False, ctx.progress):
        reply = ctx.cand.request(
            {
                "op": "check",
                "workload": w.model_dump(mode="json"),
                "axes": axes,
                "rounds": kept,
                "determinism": determinism,
                "outdir": str(ctx.outdir),
            },
            cfg.call_timeout_s,
        )
    if not reply.get("ok"):
        ref.request(trusted, {"op": "release", "tags": [r["tag"] for r in kept]})
        if reply.get("status") == "INTERNAL":
            raise GuardError(f"worker error on {label}: {reply.get('message')}")
        raise failure("correctness", reply["status"], reply.get("message", ""), w, visible, label)
    for rnd, got in zip(kept, reply["rounds"]):
        # The guard names the files itself: a path from the candidate's reply could make
        # the guard delete, or the trusted worker read, any file (the secret, the database).
        metas = own_files(got["outputs"], ctx.outdir, rnd["tag"], len(names))
        cmp = ref.request(
            trusted,
            {
                "op": "compare",
                "tag": rnd["tag"],
                "outputs": metas,
                "tolerances": tolerances,
                "names": names,
                "chunk_elements": cfg.compare_chunk_elements,
            },
        )
        for meta in metas:
            Path(meta["file"]).unlink(missing_ok=True)
        if not cmp.get("ok"):
            raise GuardError(f"comparison failed on {label}: {cmp.get('message')}")
        tally["rounds"] += 1
        if visible and rnd["kind"] == "normal":  # SOL-ExecBench's figures: random inputs only
            merge_errors(errors.setdefault(w.uuid, {}), cmp.get("reports") or [])
        if not cmp.get("passed"):
            ref.request(trusted, {"op": "release", "tags": None})
            msg = f"{cmp.get('message')} [round {rnd['tag'][rnd['tag'].index('r') + 1 :]}: {ROUND_LABEL[rnd['kind']]}]"
            msg = named_checks(msg, cmp, rnd["kind"], per_output)
            raise failure("correctness", cmp["status"], msg, w, visible, label, errors.get(w.uuid))
    return True


def merge_errors(into: dict[str, Any], reports: list[dict[str, Any]]) -> None:
    """Fold one round's per-output reports into a workload's largest errors (for traces)."""
    for rep in reports:
        for key in ("max_abs", "max_rel"):
            if isinstance(rep.get(key), (int, float)) and math.isfinite(rep[key]):
                into[key] = max(into.get(key, 0.0), float(rep[key]))
        if rep.get("within_ratio"):
            into["mismatches"] = max(into.get("mismatches", 0), int(rep.get("mismatches") or 0))
        if rep.get("nan"):
            into["has_nan"] = True
        elif rep.get("inf"):
            into["has_inf"] = True


def named_checks(message: str, cmp: dict[str, Any], kind: str, per_output: list[tolerance_mod.OutputTolerance]) -> str:
    """The message of a failed comparison, led by the KernelArc checks stricter than
    SOL-ExecBench that took part: the round's kind and the failing output's tolerance."""
    notes = []
    if kind in ROUND_WHY:
        notes.append(ROUND_WHY[kind])
    failing = len(cmp.get("reports") or []) - 1
    if cmp.get("status") == "INCORRECT_NUMERICAL" and 0 <= failing < len(per_output):
        stricter = per_output[failing].stricter
        if stricter:
            notes.append(stricter)
    return "".join(f"[{n}] " for n in notes) + message


def own_files(metas: Iterable[object], outdir: Path, tag: str, n_outputs: int) -> list[dict[str, Any]]:
    """The output descriptions of a round with the file names the guard gave: ``outdir /
    f"{tag}_{k}.bin"`` for the k-th output. A reply that names another file is a worker
    reaching for files outside its own (the secret, the database): REWARD_HACK. Shape and
    dtype stay the candidate's (checked against the file's size and against the reference)."""
    out = []
    for k, meta in enumerate(list(metas)[: n_outputs + 1]):
        meta = dict(meta) if isinstance(meta, dict) else {}
        expected = str(outdir / f"{tag}_{k}.bin")
        if meta.get("file") != expected:
            raise Rejection(
                "correctness",
                "REWARD_HACK",
                f"the candidate's worker named {str(meta.get('file'))[:200]!r} as its output "
                f"{k}, not the file the guard asked for: a candidate's process may not direct "
                "the guard to other files",
            )
        meta["file"] = expected
        out.append(meta)
    return out


def failure(
    gate: str, status: str, message: str, w: Workload, visible: bool, label: str, errors: dict[str, Any] | None = None
) -> Rejection:
    if visible:
        where = f"workload {w.uuid} {w.axes}"
        rej = Rejection(gate, status, f"{status} on {where}: {first_line(message)}", message, w.uuid)
        rej.errors = errors
        return rej
    # Held-out workloads stay hidden: say what failed, not the shape or positions.
    hint = (
        "it passes the visible workloads, so look at sizes that are odd, not powers of two, "
        "or outside the shapes you tuned for (masking, tails, strides)"
    )
    return Rejection(gate, status, f"{status} on a {label} (shape not shown): {hint}", None, label)
