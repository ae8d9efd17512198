"""Gate 3: correctness on every visible workload (random and adversarial rounds, the first
run twice for determinism) and the held-out ones, whose shapes a reason never shows. The
candidate worker writes its outputs to files; the trusted worker compares them with the
reference."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from ..config import GuardConfig
from ..problems import tolerance as tolerance_mod
from ..problems.derive import largest_tensor
from ..problems.schema import Definition, Workload
from ..runner import messages as m
from ..runner.process import WorkerDied, WorkerTimeout
from ..verdict import Checked
from . import memory_plan
from .asking import Asked, ask
from .context import EvalContext
from .reasons import GuardError, Rejection, candidate_status, died, first_line

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

R = TypeVar("R")  # a planned round, however a caller describes it
RoundKind = Literal["normal", "mixed", "large", "tiny"]  # the keys of ROUND_LABEL


def rounds(cfg: GuardConfig, d: Definition, w: Workload, visible: bool) -> list[RoundKind]:
    """The kinds of input of each round on ``w``."""
    kinds: list[RoundKind] = ["normal"] * (cfg.correctness_rounds if visible else cfg.heldout_rounds)
    # Adversarial values test numerics, not size: the largest workloads (whose outputs
    # dominate the transfer time) get the random rounds only.
    if cfg.adversarial_rounds and d.kernelarc.adversarial and largest_tensor(d, w.axes) <= ADVERSARIAL_MAX_ELEMENTS:
        kinds += ["mixed", "large", "tiny"] if visible else ["mixed"]
    return kinds


def batches(cfg: GuardConfig, d: Definition, w: Workload, planned: list[R]) -> list[list[R]]:
    """The rounds of ``w`` in groups judged together. The trusted worker holds the reference
    outputs of one group until they are compared, so a group holds as many rounds as fit in
    ``held_rounds_bytes`` of outputs, and at least one: a large workload goes a round at a time."""
    per_round = max(1, memory_plan.tensor_bytes(d, w)[1])
    size = max(1, cfg.held_rounds_bytes // per_round)
    return [planned[i : i + size] for i in range(0, len(planned), size)]


@dataclass
class _Group:
    """One group of rounds of one workload on its way through the gate."""

    w: Workload
    visible: bool
    label: str
    index: int  # the workload's place in the plan, for progress
    planned: list[m.Round]
    output_bytes: int  # of all its rounds' outputs: what the trusted worker holds for it
    kept: list[m.Round] = field(default_factory=list)  # rounds whose reference was made and is held
    determinism: bool = False


@dataclass
class _Checking:
    """A group whose rounds the candidate's worker is running (its ``Check`` sent)."""

    group: _Group
    asked: Asked[m.CheckReply]
    slot: contextlib.ExitStack  # the timing slot, held shared while candidate code runs


def check(ctx: EvalContext, part: Literal["visible", "heldout"] = "visible") -> Checked:
    """``_check``; for the held-out part, any failure of the candidate's worker (a Rejection,
    its death or hang, wherever in the part it surfaces: a worker that ended between two
    groups once showed its log tail) is reported without anything its process said."""
    if part == "visible":
        return _check(ctx, part)
    try:
        return _check(ctx, part)
    except (WorkerDied, WorkerTimeout, Rejection) as exc:
        raise _hidden_failure(exc) from None


def _check(ctx: EvalContext, part: Literal["visible", "heldout"]) -> Checked:
    """Run the rounds of the visible workloads, or of the held-out ones (``part``); the
    verdict's ``checked`` on success, a ``Rejection`` otherwise.

    The held-out workloads are checked last, after the benchmark and any paired
    re-measurement (``Guard.evaluate``): the candidate's process sees their shapes there, and
    whatever it reports afterwards (a later failure's text, its timing fields) could carry them
    back to the agent (red team, session 18). After them nothing it says is shown.

    The two workers take turns per group of rounds, and overlap where memory allows: while the
    trusted worker compares one group's outputs (and makes the next group's reference), the
    candidate's worker already runs the next group. Nothing about a verdict changes (every
    round is compared, in order, and the first failure decides); only the wait does."""
    ref, cfg, d, wset, progress = ctx.ref, ctx.cfg, ctx.definition, ctx.wset, ctx.progress
    if part == "visible":
        plan = [(w, True, w.uuid) for w in wset.visible]
    else:
        plan = [(w, False, f"held-out workload {i + 1} of {len(wset.heldout)}") for i, w in enumerate(wset.heldout)]
    first = 0 if part == "visible" else len(wset.visible)  # the round tags of the two parts never meet
    groups: list[_Group] = []
    for idx, (w, visible, label) in enumerate(plan, start=first):
        planned = [
            m.Round(seed=ref.seed("round", ctx.eval_seed, w.uuid, r), kind=kind, tag=f"w{idx}r{r}")
            for r, kind in enumerate(rounds(cfg, d, w, visible))
        ]
        per_round = memory_plan.tensor_bytes(d, w)[1]
        groups += [_Group(w, visible, label, idx, g, per_round * len(g)) for g in batches(cfg, d, w, planned)]
    tally = {"rounds": 0, "skipped": 0}
    errors: dict[str, dict[str, Any]] = {}
    # the first round judged on a visible workload also runs twice (determinism)
    undecided = {id(w) for w, visible, _ in plan if visible and cfg.check_determinism}
    checking: _Checking | None = None  # the last group sent to the candidate's worker
    shown = -1
    try:
        for group in groups:
            if checking is not None and not _may_overlap(cfg, checking.group, group):
                _judge(ctx, _finish_check(ctx, checking), tally, errors)
                checking = None
            if group.index != shown:
                progress("correctness", group.index - first, len(plan), group.label)
                shown = group.index
            # the trusted worker makes this group's reference while the candidate's worker
            # still runs the previous group; then this group runs while that one is compared
            _make_reference(ctx, group, tally)
            if group.kept and id(group.w) in undecided:
                group.determinism = True
                undecided.discard(id(group.w))
            done = _finish_check(ctx, checking) if checking is not None else None
            checking = _start_check(ctx, group) if group.kept else None
            if done is not None:
                _judge(ctx, done, tally, errors)
        if checking is not None:
            _judge(ctx, _finish_check(ctx, checking), tally, errors)
    finally:
        if checking is not None:  # a failure while the candidate's worker may still run a group
            with checking.slot:
                checking.asked.drop(cfg.call_timeout_s)
    progress("correctness", len(plan), len(plan), f"all {part} workloads passed")
    return Checked(
        visible_workloads=len(wset.visible) if part == "visible" else 0,
        heldout_workloads=len(wset.heldout) if part == "heldout" else 0,
        rounds=tally["rounds"],
        rounds_skipped=tally["skipped"],
        determinism=cfg.check_determinism,
        errors=errors,
    )


def merged(visible: Checked, heldout: Checked) -> Checked:
    """The verdict's ``checked`` from the two parts' (errors are the visible workloads')."""
    return visible.model_copy(
        update={
            "heldout_workloads": heldout.heldout_workloads,
            "rounds": (visible.rounds or 0) + (heldout.rounds or 0),
            "rounds_skipped": (visible.rounds_skipped or 0) + (heldout.rounds_skipped or 0),
        }
    )


def _may_overlap(cfg: GuardConfig, running: _Group, nxt: _Group) -> bool:
    """Whether the next group may start while the trusted worker still holds ``running``'s
    references: both workers then work at once and the trusted one holds two groups, so only
    groups whose outputs are small (``overlap_rounds_bytes``) overlap; large ones take turns."""
    limit = cfg.overlap_rounds_bytes
    return running.output_bytes <= limit and nxt.output_bytes <= limit


def _make_reference(ctx: EvalContext, group: _Group, tally: dict[str, int]) -> None:
    """The trusted worker makes (and holds) the reference outputs of the group's rounds;
    ``group.kept`` gets the rounds that can be judged."""
    ref, cfg, d = ctx.ref, ctx.cfg, ctx.definition
    w = group.w
    made = ask(
        ctx.trusted,
        m.Reference(
            key=ctx.key,
            workload=w.model_dump(mode="json"),
            axes=d.resolve_axes(w.axes),
            rounds=group.planned,
            chunk_elements=cfg.chunk_elements(ctx.ref.device.kind),
        ),
        m.ReferenceReply,
        max(cfg.call_timeout_s, 120),
        "correctness",
    )
    if not made.ok:  # not one round: never read as rounds to skip
        log.error("the references of %s (%s) could not be made: %s", group.label, w.uuid, made.message)
        shown = made.message if group.visible else "the trusted worker's message is in the server's log"
        raise GuardError(f"the trusted worker could not make the references on {group.label}: {shown}")
    for rnd, info in zip(group.planned, made.rounds):
        if not info.ok:
            if group.visible and ref.device.kind != "cpu" and rnd.kind == "normal":
                raise GuardError(f"problem {d.name}: the reference fails on {w.uuid}: {info.message}")
            log.warning("reference failed on %s (%s): %s; round skipped", group.label, rnd.kind, info.message)
            tally["skipped"] += 1
            continue
        if rnd.kind != "normal" and not info.finite:
            tally["skipped"] += 1  # the op does not allow these values: the reference overflows
            release(ctx, [rnd.tag])
            continue
        group.kept.append(rnd)


def _start_check(ctx: EvalContext, group: _Group) -> _Checking:
    """The candidate's worker starts running the group's kept rounds."""
    slot = contextlib.ExitStack()
    slot.enter_context(ctx.ref.hold(False, ctx.progress))
    try:
        asked = Asked(
            ctx.cand,
            m.Check(
                workload=group.w.model_dump(mode="json"),
                axes=ctx.definition.resolve_axes(group.w.axes),
                rounds=group.kept,
                call_bytes=sum(memory_plan.tensor_bytes(ctx.definition, group.w)),
                repeat=_repeat(ctx.definition, group.w) if group.determinism else None,
                outdir=str(ctx.outdir),
            ),
            m.CheckReply,
            "correctness",
        )
    except BaseException:
        slot.close()
        raise
    return _Checking(group, asked, slot)


def _finish_check(ctx: EvalContext, checking: _Checking) -> tuple[_Group, m.CheckReply]:
    """The candidate's outputs of a started group (a ``Rejection`` when its run failed)."""
    group = checking.group
    with checking.slot:
        reply = checking.asked.reply(ctx.cfg.call_timeout_s)
    if not reply.ok:
        release(ctx, [r.tag for r in group.kept])
        if reply.status == "INTERNAL":
            log.warning("the candidate's worker failed in its own step on %s: %s", group.label, reply.message)
        raise failure(
            "correctness", candidate_status(reply.status), reply.message or "", group.w, group.visible, group.label
        )
    return group, reply


def _hidden_failure(exc: WorkerDied | WorkerTimeout | Rejection) -> Rejection:
    """The verdict of a candidate's worker that failed on the held-out part, without what its
    process said: its log tail and any text it chose carry what it saw (a candidate that
    printed the held-out shape and exited had it shown in the verdict's diagnostic). The
    operator's log keeps the whole of it."""
    log.warning("the candidate's worker failed on the held-out workloads: %s", exc)
    if isinstance(exc, WorkerTimeout):
        status = "TIMEOUT"
    elif isinstance(exc, WorkerDied):
        status = died("correctness", exc).status
    else:
        status = exc.status
    label = exc.workload if isinstance(exc, Rejection) and exc.workload else "held-out workload"
    return hidden_failure("correctness", status, label)


def _repeat(definition: Definition, w: Workload) -> m.Repeat:
    """The first round's second call: bitwise, or within each output's tolerance where the
    problem allows repeats to differ (a KernelBench reference may use cuDNN's atomics)."""
    if definition.kernelarc.deterministic:
        return m.Repeat()
    return m.Repeat(within=_tolerances(tolerance_mod.for_workload(definition, w).values()))


def _tolerances(per_output: Iterable[tolerance_mod.OutputTolerance]) -> list[m.Tolerance]:
    """Each output's tolerance as the workers take it, in the outputs' order."""
    return [m.Tolerance.model_validate(t.message()) for t in per_output]


def _judge(
    ctx: EvalContext,
    checked: tuple[_Group, m.CheckReply],
    tally: dict[str, int],
    errors: dict[str, dict[str, Any]],
) -> None:
    """Each round of a group compared with its reference, in order; the references let go.
    A ``Rejection`` when one fails."""
    group, reply = checked
    cfg, d, trusted, w = ctx.cfg, ctx.definition, ctx.trusted, group.w
    names = list(d.outputs)
    per_output = list(tolerance_mod.for_workload(d, w).values())
    tolerances = _tolerances(per_output)
    timeout = max(cfg.call_timeout_s, 120)
    answered = [got.tag for got in reply.rounds]
    if answered != [rnd.tag for rnd in group.kept]:
        # every round asked for must come back, in order: a reply that left some out had them
        # judged by nothing (a red team's patched worker answered no rounds and was ACCEPTed)
        raise Rejection(
            "correctness",
            "REWARD_HACK",
            f"the candidate's worker answered {len(answered)} rounds of {len(group.kept)} asked for on "
            f"{group.label}: its process does not run the guard's checks as written",
        )
    for rnd, got in zip(group.kept, reply.rounds):
        # The guard names the files itself: a path from the candidate's reply could make
        # the guard delete, or the trusted worker read, any file (the secret, the database).
        metas = own_files(got.outputs, ctx.outdir, rnd.tag, len(names))
        cmp = ask(
            trusted,
            m.Compare(
                tag=rnd.tag,
                outputs=metas,
                tolerances=tolerances,
                names=names,
                chunk_elements=cfg.chunk_elements(ctx.ref.device.kind),
            ),
            m.CompareReply,
            timeout,
            "correctness",
        )
        for meta in metas:
            ctx.cand.remove_output(Path(meta.file).name)
        if not cmp.ok:
            # the trusted worker's own failure; its text is not shown for a held-out workload
            log.error("comparison failed on %s (%s): %s", group.label, w.uuid, cmp.message)
            shown = cmp.message if group.visible else "the trusted worker's message is in the server's log"
            raise GuardError(f"comparison failed on {group.label}: {shown}")
        tally["rounds"] += 1
        if group.visible and rnd.kind == "normal":  # SOL-ExecBench's figures: random inputs only
            merge_errors(errors.setdefault(w.uuid, {}), cmp.reports)
        if not cmp.passed:
            release(ctx, None)
            msg = f"{cmp.message} [round {rnd.tag[rnd.tag.index('r') + 1 :]}: {ROUND_LABEL[rnd.kind]}]"
            msg = named_checks(msg, cmp, rnd.kind, per_output)
            raise failure(
                "correctness",
                cmp.status or "INCORRECT_NUMERICAL",
                msg,
                w,
                group.visible,
                group.label,
                errors.get(w.uuid),
            )


def release(ctx: EvalContext, tags: list[str] | None) -> None:
    """The trusted worker lets go of the reference outputs of ``tags`` (None: all it holds)."""
    ask(ctx.trusted, m.Release(tags=tags), m.Reply, max(ctx.cfg.call_timeout_s, 120), "correctness")


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


def named_checks(message: str, cmp: m.CompareReply, kind: str, per_output: list[tolerance_mod.OutputTolerance]) -> str:
    """The message of a failed comparison, led by the KernelArc checks stricter than
    SOL-ExecBench that took part: the round's kind and the failing output's tolerance."""
    notes = []
    if kind in ROUND_WHY:
        notes.append(ROUND_WHY[kind])
    failing = len(cmp.reports) - 1
    if cmp.status == "INCORRECT_NUMERICAL" and 0 <= failing < len(per_output):
        stricter = per_output[failing].stricter
        if stricter:
            notes.append(stricter)
    return "".join(f"[{n}] " for n in notes) + message


def own_files(metas: Iterable[m.TensorMeta], outdir: Path, tag: str, n_outputs: int) -> list[m.TensorMeta]:
    """The output descriptions of a round with the file names the guard gave: ``outdir /
    f"{tag}_{k}.bin"`` for the k-th output. A reply that names another file is a worker
    reaching for files outside its own (the secret, the database): REWARD_HACK. Shape and
    dtype stay the candidate's (checked against the file's size and against the reference)."""
    out = []
    for k, meta in enumerate(list(metas)[: n_outputs + 1]):
        expected = str(outdir / f"{tag}_{k}.bin")
        if meta.file != expected:
            raise Rejection(
                "correctness",
                "REWARD_HACK",
                f"the candidate's worker named {meta.file[:200]!r} as its output "
                f"{k}, not the file the guard asked for: a candidate's process may not direct "
                "the guard to other files",
            )
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
    return hidden_failure(gate, status, label)


def hidden_failure(gate: str, status: str, label: str) -> Rejection:
    """A held-out workload's failure: what failed, not the shape, positions or any text."""
    hint = (
        "it passes the visible workloads, so look at sizes that are odd, not powers of two, "
        "or outside the shapes you tuned for (masking, tails, strides)"
    )
    return Rejection(gate, status, f"{status} on a {label} (shape not shown): {hint}", None, label)
