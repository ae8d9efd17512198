"""Gates 6 and 7: the decision (against the agent's best and the global best, from the
paired comparison where one was made) and the record of it: the verdict in the database,
accepted candidates committed to the git archive, duplicates judged from their prior."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any, cast

from .. import decision as decision_mod
from .. import scoring
from ..archive.db import Database
from ..archive.git_archive import GitArchive
from ..config import GuardConfig
from ..problems.problem import Problem
from ..repetition import repeats
from ..runner import device as device_mod
from ..verdict import (
    Checked,
    DeviceInfo,
    Gate,
    PairedEntry,
    PairedLabel,
    PairedWorkload,
    TraceStatus,
    Verdict,
    WorkloadResult,
)
from .memory_plan import PeakWatch
from .pairing_gate import PairedRun, elsewhere_unclear, latencies, measurements, paired_for, unclear_why
from .reasons import Rejection


class Recorder:
    def __init__(
        self,
        db: Database,
        cfg: GuardConfig,
        device: "device_mod.DeviceChoice",
        archive: GitArchive,
        device_info: Callable[[], dict[str, Any]],
    ):
        self.db, self.cfg, self.device, self.archive = db, cfg, device, archive
        self.device_info = device_info  # the verdict's device (with the ceilings once measured)

    def reject(
        self,
        cid: str,
        problem: Problem,
        agent: str,
        rej: Rejection,
        phases: dict[str, float],
        notes: str | None,
        parent: str | None,
        memory: PeakWatch | None = None,
    ) -> Verdict:
        with self.db.transaction() as c:
            history = _history(self.db, c, problem.name, agent)
            best = self.db.agent_best(
                c, problem.name, problem.definition.content_hash(), agent, self.device.compare_key
            )
            gbest = self.db.global_best(c, problem.name, problem.definition.content_hash(), self.device.compare_key)
            advice = decision_mod.advise("REJECT", history, None, best["sol_fraction"] if best else None, self.cfg)
            row = c.execute(
                "SELECT source_hash, normalized_hash, notes FROM candidates WHERE id = ?", (cid,)
            ).fetchone()
            verdict = Verdict(
                candidate_id=cid,
                problem=problem.name,
                agent=agent,
                decision="REJECT",
                # a gate's or a worker's words: the verdict's model checks them
                status=cast(TraceStatus, rej.status),
                gate=cast(Gate, rej.gate),
                reason=rej.reason,
                diagnostic=rej.diagnostic,
                first_failing_workload=rej.workload,
                advice=advice,
                phases_s=phases,
                checked=Checked(errors={rej.workload: rej.errors}) if rej.errors and rej.workload else Checked(),
                agent_best_id=best["id"] if best else None,
                global_best_id=gbest["id"] if gbest else None,
                device=DeviceInfo.model_validate(self.device_info()),
                notes=notes,
                parent=parent,
                peak_memory_bytes=memory.overall() if memory else None,
                peak_memory_by_gate=memory.by_gate or None if memory else None,
                repeats=repeats(c, problem.name, agent, row["source_hash"], row["normalized_hash"], notes, cid),
            )
            self.db.finish(c, cid, row_fields(verdict), [])
        return verdict

    def measured(
        self,
        cid: str,
        problem: Problem,
        agent: str,
        workloads: list[WorkloadResult],
        checked: Checked,
        phases: dict[str, float],
        notes: str | None,
        parent: str | None,
        solution_json: dict[str, Any],
        duplicate_of: str | None = None,
        paired: dict[PairedLabel, PairedRun] | None = None,
        memory: PeakWatch | None = None,
    ) -> Verdict:
        cfg, device = self.cfg, self.device
        dhash = problem.definition.content_hash()
        new = latencies(workloads)
        sol_fraction = scoring.geomean([w.sol_fraction for w in workloads])
        with self.db.transaction() as c:
            best = self.db.agent_best(c, problem.name, dhash, agent, device.compare_key)
            gbest = self.db.global_best(c, problem.name, dhash, device.compare_key)
            cmp = paired_for(paired, "agent", best)
            was_paired = cmp is not None
            unsure = False  # an unpaired, unclear comparison with a best measured on another device
            if cmp is None and best:
                cmp = decision_mod.compare(new, measurements(c, best["id"]), cfg)
                unsure = elsewhere_unclear(best, cmp, cfg, device)
            decision = decision_mod.decide(cmp)
            if best and cmp is None:  # nothing in common with the best (no figure to compare)
                decision = "KEEP"
            # A stored comparison that decides nothing unpaired gives no ACCEPT unless it was
            # re-measured side by side: a duplicate (its figures reused), or a pairing that could
            # not be made, would otherwise turn one slow window of the best into a gain.
            unconfirmed = None
            if decision == "ACCEPT" and best and cmp and not was_paired and not unsure:
                unconfirmed = unclear_why(c, best, cmp, workloads, cfg, device)
                if unconfirmed:
                    decision = "KEEP"
            # the best ran slower than its own record when timed again: the pairing decided
            # nothing, and a stored comparison that was not clear-cut decides nothing either way
            inconclusive = _inconclusive(paired, "agent", best)
            if inconclusive and decision != "KEEP":
                decision = "KEEP"
            if unsure and decision != "KEEP":
                # The best changed (on another device) while this one was measured: no ACCEPT or
                # REVERT from figures taken on two devices; a resubmission is compared properly.
                decision = "KEEP"
            is_global = False
            global_note = ""
            if decision == "ACCEPT":
                cmp_g = paired_for(paired, "global", gbest)
                if cmp_g is None and gbest:
                    cmp_g = decision_mod.compare(new, measurements(c, gbest["id"]), cfg)
                    # not decidable from figures of two devices, from nothing in common, or from
                    # stored figures that are not clear-cut: the global best stays; unless that
                    # best, another agent's, spoiled its own re-measurement
                    stored_decides = _stored_decides(paired, gbest)
                    is_global = (
                        cmp_g is not None
                        and (stored_decides or unclear_why(c, gbest, cmp_g, workloads, cfg, device) is None)
                        and decision_mod.beats(cmp_g)
                    )
                    if is_global and stored_decides and cmp_g is not None:
                        global_note = (
                            f" (the global best {gbest['id']} did not run as its record says when timed again: "
                            f"the stored comparison, {cmp_g.speedup:.3f}x, decides)"
                        )
                else:
                    is_global = decision_mod.beats(cmp_g)
            history = _history(self.db, c, problem.name, agent)
            advice = decision_mod.advise(decision, history, sol_fraction, best["sol_fraction"] if best else None, cfg)
            row = c.execute("SELECT source_hash, normalized_hash FROM candidates WHERE id = ?", (cid,)).fetchone()
            repeated = repeats(c, problem.name, agent, row["source_hash"], row["normalized_hash"], notes, cid)
            if best is None:
                reason = "first correct candidate of this agent: it becomes the agent's best"
            elif cmp is None:
                reason = f"no workload measured in common with the agent's best {best['id']}: it stays the best"
            else:
                assert best is not None  # a comparison is made with the agent's best only
                word = {"ACCEPT": "faster than", "KEEP": "within the noise of", "REVERT": "slower than"}[decision]
                if inconclusive:
                    word = "undecided against"
                reason = (
                    f"{word} the agent's best {best['id']}: speedup {cmp.speedup:.3f}x "
                    f"(threshold {cmp.threshold:.1%}" + (", re-measured side by side)" if was_paired else ")")
                )
                if decision == "REVERT":
                    reason += f"; go back to {best['id']}"
                if inconclusive:
                    reason += (
                        f"; {inconclusive}, and the stored comparison is not clear-cut: no ACCEPT or REVERT "
                        "(resubmit a changed copy to be compared again, in another window)"
                    )
                elif unconfirmed:
                    reason += (
                        f"; {unconfirmed}, and it was not re-measured side by side (a duplicate's figures, "
                        "or the best could not be timed again), so no ACCEPT is drawn: resubmit a changed copy"
                    )
                if unsure:
                    reason += (
                        "; the best was measured on another device and changed during this evaluation, "
                        "so no ACCEPT or REVERT is drawn from it: resubmit to compare on one device"
                    )
            if is_global:
                reason += "; new global best" + global_note
            verdict = Verdict(
                candidate_id=cid,
                problem=problem.name,
                agent=agent,
                decision=decision,
                status="PASSED",
                reason=reason,
                score=scoring.mean([w.sol_score for w in workloads]),
                speedup_eager=scoring.geomean([w.speedup_eager for w in workloads]),
                speedup_compile=scoring.geomean([w.speedup_compile for w in workloads]),
                sol_fraction=sol_fraction,
                latency_ms=scoring.geomean([w.latency_ms for w in workloads]),
                speedup_vs_best=cmp.speedup if cmp else None,
                threshold=cmp.threshold if cmp else None,
                agent_best_id=cid if decision == "ACCEPT" else (best["id"] if best else None),
                global_best_id=cid if is_global else (gbest["id"] if gbest else None),
                is_global_best=is_global,
                duplicate_of=duplicate_of,
                advice=advice,
                workloads=workloads,
                checked=checked,
                phases_s=phases,
                device=DeviceInfo.model_validate(self.device_info()),
                notes=notes,
                parent=parent,
                paired=paired_summary(paired),
                repeats=repeated,
                peak_memory_bytes=memory.overall() if memory else None,
                peak_memory_by_gate=memory.by_gate or None if memory else None,
            )
            self.db.finish(c, cid, row_fields(verdict), [w.model_dump() for w in workloads])
        if decision == "ACCEPT" and duplicate_of is None:
            self.archive.commit(problem.name, agent, cid, solution_json, summary(verdict))
        return verdict

    def duplicate(
        self, cid: str, prior: sqlite3.Row, problem: Problem, agent: str, notes: str | None, parent: str | None
    ) -> Verdict:
        """A source identical to ``prior`` (a stored row): judged again from its verdict."""
        prior_verdict = Verdict.model_validate_json(prior["verdict_json"])
        # the row decides: an ACCEPT revoked when timed again is a REJECT there (``revoke``)
        if prior["decision"] == "REJECT":
            rej = Rejection(
                prior["gate"] or "correctness",
                prior["status"],
                f"identical to {prior['id']}, already rejected: {prior['reason']}",
                prior_verdict.diagnostic,
                prior_verdict.first_failing_workload,
            )
            v = self.reject(cid, problem, agent, rej, {}, notes, parent)
        else:
            v = self.measured(
                cid,
                problem,
                agent,
                prior_verdict.workloads,
                prior_verdict.checked,
                {},
                notes,
                parent,
                json.loads(prior["solution_json"]),
                duplicate_of=prior["id"],
            )
        with self.db.transaction() as c:
            c.execute("UPDATE candidates SET duplicate_of = ? WHERE id = ?", (prior["id"], cid))
        now = self.db.candidate(prior["id"])
        if v.decision != "REJECT" and now is not None and now["decision"] == "REJECT":
            # the prior was revoked while this copy was judged from it (another device's job,
            # another server on the workspace): the copy follows it, as one judged after would
            self.db.revoke(cid, now["status"], f"identical to {prior['id']}, caught meanwhile: {now['reason']}")
            stored = self.db.candidate(cid)
            assert stored is not None  # recorded just above
            v = Verdict.model_validate_json(stored["verdict_json"])
        v.duplicate_of = prior["id"]
        v.reason = f"identical source already evaluated as {prior['id']} (not measured again); " + v.reason
        return v


def _history(db: Database, c: sqlite3.Connection, problem: str, agent: str) -> list[dict[str, Any]]:
    return [dict(r) for r in db.agent_history(c, problem, agent)]


def row_fields(v: Verdict) -> dict[str, Any]:
    """The candidate row's columns from a verdict."""
    return {
        "decision": v.decision,
        "status": v.status,
        "gate": v.gate,
        "reason": v.reason,
        "diagnostic": v.diagnostic,
        "first_failing_workload": v.first_failing_workload,
        "score": v.score,
        "speedup_eager": v.speedup_eager,
        "speedup_compile": v.speedup_compile,
        "sol_fraction": v.sol_fraction,
        "latency_ms": v.latency_ms,
        "speedup_vs_best": v.speedup_vs_best,
        "threshold": v.threshold,
        "global_best": int(v.is_global_best),
        "duplicate_of": v.duplicate_of,
        "verdict_json": v.model_dump_json(),
    }


def _stored_decides(paired: dict[PairedLabel, PairedRun] | None, gbest: sqlite3.Row | None) -> bool:
    """Whether the global best, another agent's, spoiled its own re-measurement beside this
    candidate (``pairing_gate._pair_once``): the stored comparison then decides the label."""
    entry = (paired or {}).get("global")
    return bool(gbest is not None and entry and entry["incumbent"] == gbest["id"] and entry.get("stored_decides"))


def _inconclusive(
    paired: dict[PairedLabel, PairedRun] | None, label: PairedLabel, row: sqlite3.Row | None
) -> str | None:
    """Why the pairing against ``row`` decided nothing, where its incumbent ran slower than its
    own record allows (``pairing_gate._check_the_incumbent``); None otherwise."""
    entry = (paired or {}).get(label)
    if row is None or not entry or entry["incumbent"] != row["id"] or not entry.get("inconclusive"):
        return None
    return entry.get("note") or "the incumbent ran slower than its own record allows"


def paired_summary(paired: dict[PairedLabel, PairedRun] | None) -> dict[PairedLabel, PairedEntry] | None:
    """The verdict's ``paired``: per label what was re-measured, and the milliseconds."""
    if not paired:
        return None
    out: dict[PairedLabel, PairedEntry] = {}
    for label, e in paired.items():
        cmp = e.get("comparison")
        out[label] = PairedEntry(
            incumbent=e["incumbent"],
            stored_speedup=e.get("stored_speedup"),
            why=e.get("why"),
            paired_speedup=cmp.speedup if cmp else None,
            threshold=cmp.threshold if cmp else None,
            note=e.get("note"),
            incumbent_slowdown=e.get("slowdown"),
            inconclusive=e.get("inconclusive"),
            workloads={
                u: PairedWorkload(
                    incumbent_ms=[x[0] for x in s["incumbent"]], challenger_ms=[x[0] for x in s["challenger"]]
                )
                for u, s in (e.get("samples") or {}).items()
            },
        )
    return out


def summary(v: Verdict) -> dict[str, Any]:
    """What the git archive's commit message carries."""
    return {
        k: getattr(v, k)
        for k in (
            "candidate_id",
            "problem",
            "agent",
            "decision",
            "status",
            "score",
            "speedup_eager",
            "speedup_compile",
            "sol_fraction",
            "latency_ms",
            "is_global_best",
            "reason",
        )
    }
