"""Comparisons with stored candidates: their measurements, the device they were measured
on, and the paired re-measurement (guard/pairing.py holds its arithmetic) against the
agent's best and, for a likely ACCEPT, the global best, when the stored comparison is not
clear-cut or the incumbent was measured on another device of the group."""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from typing import NotRequired, TypedDict

from .. import decision as decision_mod
from ..archive.db import Database
from ..config import GuardConfig
from ..pairing import PairedSamples, incumbent_slowdown, needs_pairing, paired_comparison
from ..runner import device as device_mod
from ..runner.pool import WorkerPool
from ..verdict import PairedLabel, WorkloadResult
from .benchmark_gate import remeasure
from .context import EvalContext
from .reasons import Unpaired

log = logging.getLogger(__name__)


class PairedRun(TypedDict):
    """A paired re-measurement against one incumbent (a stored candidate row)."""

    incumbent: str  # the incumbent's candidate id
    stored_speedup: float  # the comparison with its stored figures
    comparison: decision_mod.Comparison | None  # the paired one; None when it could not be made
    why: str  # why it was re-measured
    samples: NotRequired[dict[str, PairedSamples]]
    # the incumbent's paired figures over what its own record allows (``pairing.incumbent_slowdown``)
    slowdown: NotRequired[float]
    inconclusive: NotRequired[bool]  # it ran slower than its record beyond the pairing's noise
    # another agent's global best that spoiled its own re-measurement (inconclusive, or failed
    # to run again): the stored comparison decides the global label, clear-cut or not
    stored_decides: NotRequired[bool]
    note: NotRequired[str]  # why the incumbent could not be timed again, or why it decided nothing


def latencies(workloads: list[WorkloadResult]) -> dict[str, tuple[float, float]]:
    """The measured workloads' (median latency, relative standard error), as
    ``decision.compare`` takes them."""
    return {w.uuid: (w.latency_ms, w.rel_se or 0.0) for w in workloads if w.latency_ms is not None}


def timing_methods(c: sqlite3.Connection, cid: str) -> dict[str, str]:
    """A stored candidate's workload -> the method that timed it (``Timing.method``)."""
    rows = c.execute("SELECT workload, result_json FROM workload_results WHERE candidate_id = ?", (cid,)).fetchall()
    out = {}
    for r in rows:
        timing = json.loads(r["result_json"] or "{}").get("timing") or {}
        if timing.get("method"):
            out[r["workload"]] = _method(timing["method"], timing.get("floored_by_outside_clock"))
    return out


def _method(method: str, floored: object) -> str:
    """The method as pairing reads it: a figure the outside clock floored was not CUPTI's."""
    return f"{method}+floored" if floored else method


def without_cupti(workloads: list[WorkloadResult], stored: dict[str, str]) -> list[str]:
    """Workloads, in common with a stored candidate, that a GPU timed without CUPTI's device
    records on either side (CUDA events alone: the launch and its jitter included, and a
    window's shift that their own spread does not show; session 12 saw a 1.37x false
    ACCEPT from such figures). Two clocks, or one this loose, decide nothing unpaired. Nor
    does a GPU figure that the outside clock floored (a host-bound loop): it holds host time,
    which moves with the machine's load, and keeps the spread of the span it replaced."""

    def loose(method: str | None) -> bool:
        return method is not None and method.startswith("cuda") and ("cupti" not in method or "floored" in method)

    def current(w: WorkloadResult) -> str | None:
        if w.timing is None or not w.timing.method:
            return None
        return _method(w.timing.method, (w.timing.model_extra or {}).get("floored_by_outside_clock"))

    return [w.uuid for w in workloads if w.uuid in stored and (loose(stored[w.uuid]) or loose(current(w)))]


def unclear_why(
    c: sqlite3.Connection,
    row: sqlite3.Row,
    stored: decision_mod.Comparison,
    workloads: list[WorkloadResult],
    cfg: GuardConfig,
    device: "device_mod.DeviceChoice",
) -> str | None:
    """Why the comparison with a stored candidate (``row``, compared as ``stored``) decides
    nothing unless both are timed again side by side; None when it is decisive as it stands.
    The one rule the pairing gate re-measures by, and the recording refuses an unpaired ACCEPT
    or global best by (a duplicate, or an incumbent that could not be timed again)."""
    if measured_elsewhere(row, device):
        # compare only what was measured here, unless clear-cut even across devices
        unclear = elsewhere_unclear(row, stored, cfg, device)
        return f"the incumbent was measured on another device ({measured_on(row)})" if unclear else None
    if loose := without_cupti(workloads, timing_methods(c, row["id"])):
        unclear = needs_pairing(stored, math.inf)
        why = f"timed without CUPTI, or floored by the guard's clock, on one side ({len(loose)} workloads, e.g. {loose[0]})"
        return why if unclear else None
    return "the stored comparison is not clear-cut" if needs_pairing(stored, pairing_band(cfg, device)) else None


def pairing_band(cfg: GuardConfig, device: "device_mod.DeviceChoice") -> float:
    return cfg.pairing_band_gpu if device.kind == "cuda" else cfg.pairing_band_cpu


def measured_on(row: sqlite3.Row) -> str:
    key: str = row["measured_on"] or row["device_key"]  # rows from before measured_on: their key
    return key


def measured_elsewhere(row: sqlite3.Row | None, device: "device_mod.DeviceChoice") -> bool:
    return row is not None and measured_on(row) != device.key


def elsewhere_unclear(
    row: sqlite3.Row | None, cmp: decision_mod.Comparison | None, cfg: GuardConfig, device: "device_mod.DeviceChoice"
) -> bool:
    """A stored comparison with a row measured on another device, inside the pairing band."""
    if cmp is None or not measured_elsewhere(row, device):
        return False
    band = pairing_band(cfg, device)
    return 1 / band < cmp.speedup < band


def paired_for(
    paired: dict[PairedLabel, PairedRun] | None, label: PairedLabel, row: sqlite3.Row | None
) -> decision_mod.Comparison | None:
    """The paired comparison made against ``row`` (None when it was not the one paired with)."""
    entry = (paired or {}).get(label)
    if row is None or not entry or entry["incumbent"] != row["id"]:
        return None
    return entry["comparison"]


def measurements(c: sqlite3.Connection, cid: str) -> dict[str, tuple[float, float]]:
    """A stored candidate's workload -> (median latency, relative standard error)."""
    rows = c.execute(
        "SELECT workload, latency_ms, rel_se FROM workload_results WHERE candidate_id = ?", (cid,)
    ).fetchall()
    return {r["workload"]: (r["latency_ms"], r["rel_se"] or 0.0) for r in rows if r["latency_ms"]}


def pairings(
    ctx: EvalContext, db: Database, pool: WorkerPool, workloads: list[WorkloadResult], agent: str
) -> dict[PairedLabel, PairedRun]:
    """Paired re-measurements against the agent's best and, for a likely ACCEPT, the
    global best, when the stored comparison is not clear-cut: label -> entry with the
    incumbent's id, the stored speedup, why, the samples and their comparison (or a note).

    An incumbent caught cheating when timed again (REWARD_HACK) loses its ACCEPT in the
    database (``Database.revoke``), and the comparison is made again with the bests before
    it; its entry stays in the result, with the note, where no other incumbent took its label."""
    revoked: dict[PairedLabel, PairedRun] = {}
    while True:
        out, caught = _pair_once(ctx, db, pool, workloads, agent)
        if not caught:
            return {**revoked, **out}
        for label, entry in caught.items():
            db.revoke(entry["incumbent"], "REWARD_HACK", f"revoked when timed again beside {ctx.cid}: {entry['note']}")
            log.warning("incumbent %s revoked: %s", entry["incumbent"], entry["note"])
            revoked[label] = entry


def _check_the_incumbent(
    entry: PairedRun, record: dict[str, tuple[float, float]], challenger: dict[str, tuple[float, float]]
) -> None:
    """An incumbent that ran slower than its own record allows, beyond the pairing's own noise,
    leaves the pairing inconclusive: its comparison is dropped, and the recording draws neither
    an ACCEPT nor a REVERT from the stored one (``pairing.incumbent_slowdown``)."""
    cmp = entry["comparison"]
    slowdown = incumbent_slowdown(entry.get("samples") or {}, record, challenger)
    if cmp is None or slowdown is None:
        return
    entry["slowdown"] = slowdown
    if slowdown > 1 + cmp.threshold:
        entry["inconclusive"] = True
        entry["comparison"] = None
        entry["note"] = (
            f"the incumbent ran {slowdown:.2f}x slower than its own record allows when timed again (the "
            f"side-by-side speedup {cmp.speedup:.3f}x against {entry['stored_speedup']:.3f}x stored, beyond the "
            f"pairing's noise of {cmp.threshold:.1%}; its record may come from a fast window, or it ran slow "
            "on purpose, which the guard cannot tell apart): the re-measurement decides nothing"
        )
        log.info("%s: %s", entry["incumbent"], entry["note"])


def _pair_once(
    ctx: EvalContext, db: Database, pool: WorkerPool, workloads: list[WorkloadResult], agent: str
) -> tuple[dict[PairedLabel, PairedRun], dict[PairedLabel, PairedRun]]:
    """One pass of ``pairings`` against the bests as the database has them now: (entries,
    entries of incumbents caught cheating, whose pass stopped there)."""
    cfg, device, problem = ctx.cfg, ctx.ref.device, ctx.problem
    dhash = problem.definition.content_hash()
    new = latencies(workloads)
    conn = db.reader()
    best = db.agent_best(conn, problem.name, dhash, agent, device.compare_key)
    gbest = db.global_best(conn, problem.name, dhash, device.compare_key)
    out: dict[PairedLabel, PairedRun] = {}
    incumbents: tuple[tuple[PairedLabel, sqlite3.Row | None], ...] = (("agent", best), ("global", gbest))
    for label, row in incumbents:
        if row is None:
            continue
        if label == "global":
            if best is not None and row["id"] == best["id"]:
                if "agent" in out:
                    out["global"] = out["agent"]
                continue
            agent_entry = out.get("agent")
            agent_cmp = agent_entry["comparison"] if agent_entry else None
            if agent_cmp is None and best is not None:
                agent_cmp = decision_mod.compare(new, measurements(conn, best["id"]), cfg)
            if decision_mod.decide(agent_cmp) != "ACCEPT":
                continue
        record = measurements(conn, row["id"])
        stored = decision_mod.compare(new, record, cfg)
        if stored is None:  # no workload in common: nothing to re-measure
            continue
        why = unclear_why(conn, row, stored, workloads, cfg, device)
        if why is None:
            continue
        entry: PairedRun = {"incumbent": row["id"], "stored_speedup": stored.speedup, "comparison": None, "why": why}
        # Another agent's global best gains from a challenger's failure: where it spoils its own
        # re-measurement, the stored comparison decides (red team, session 39: a global best
        # that ran slow, or crashed, when timed again kept its title against every challenger
        # inside the band). Where the stored comparison favours the challenger less than the
        # side-by-side one, which is what "slower than its record" says, that is the lower
        # figure; an agent's own incumbent decides nothing (recording: KEEP).
        others = label == "global" and row["agent"] != agent
        try:
            entry["samples"] = remeasure(ctx, pool, row)
            entry["comparison"] = paired_comparison(entry["samples"], cfg)
            _check_the_incumbent(entry, record, new)
            if others and entry.get("inconclusive"):
                entry["stored_decides"] = True
        except Unpaired as exc:
            entry["note"] = str(exc)
            if exc.status == "REWARD_HACK":
                entry["note"] = f"the incumbent was caught and its ACCEPT revoked: {exc}"
                return out, {label: entry}
            if others and exc.status is not None:  # its own failure, not the device's or the guard's
                entry["stored_decides"] = True
            log.warning("paired re-measurement skipped: %s", exc)
        out[label] = entry
    return out, {}
