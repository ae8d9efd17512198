"""``kernelarc report RUN``: the run's leaderboard, a plot of score over time per agent, and
the best kernel exported as ``solution.json`` plus its sources.

Bests are the guard's: an agent's best is its latest ACCEPT (each one was judged better than
the one before, side by side where it was close), and the run's best is the latest of its
candidates the guard made the global best. A higher stored score is not enough: the guard's
paired re-measurement may have refused that candidate the title."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from guard.archive.db import Database
from guard.candidates.solution import check_source_path

from .run import RunFolder

log = logging.getLogger(__name__)


def _candidates(db: Database, problem: str, agents: list[str]) -> list[dict]:
    if not agents:
        return []
    marks = ",".join("?" for _ in agents)
    rows = db.query(
        f"SELECT * FROM candidates WHERE problem = ? AND agent IN ({marks}) AND state = 'done' ORDER BY finished_at",
        (problem, *agents),
    )
    return [dict(r) for r in rows]


def _metric(c: dict) -> float | None:
    """What the plot and ranking use: the SOL score, else the speedup over eager."""
    return c["score"] if c["score"] is not None else c["speedup_eager"]


def _run_best(cands: list[dict]) -> dict | None:
    """The latest of ``cands`` (in the order judged) that the guard made the global best and
    still holds it as ACCEPT; where none did (the title stayed with another run's), the best
    by score of the agents' own bests."""
    accepted = [c for c in cands if c["decision"] == "ACCEPT"]
    flagged = [c for c in accepted if c["global_best"]]
    if flagged:
        return flagged[-1]
    own = {c["agent"]: c for c in accepted}  # the latest ACCEPT of each agent
    return max(own.values(), key=lambda c: _metric(c) or 0, default=None)


def best_of_run(workspace_root: Path, run_id: str) -> dict | None:
    """The run's best candidate (``_run_best``), or None."""
    run = RunFolder(workspace_root, run_id)
    if not run.config_path.is_file():
        raise ValueError(f"no run {run_id!r} in {workspace_root}")
    config = run.load()
    db = Database(Path(workspace_root) / "workspace.db")
    return _run_best(_candidates(db, config["problem"], [a["name"] for a in config["agents"]]))


def build_report(workspace_root: Path, run_id: str) -> Path:
    folder = RunFolder(workspace_root, run_id)
    run = folder.load()
    db = Database(Path(workspace_root) / "workspace.db")
    agents = [a["name"] for a in run["agents"]]
    cands = _candidates(db, run["problem"], agents)
    out = folder.report_dir
    out.mkdir(parents=True, exist_ok=True)
    start = run.get("started_at") or (cands[0]["created_at"] if cands else 0)

    rows = []
    for a in run["agents"]:
        mine = [c for c in cands if c["agent"] == a["name"]]
        accepted = [c for c in mine if c["decision"] == "ACCEPT"]
        best = accepted[-1] if accepted else None  # the guard's best of this agent
        rows.append(
            {
                "agent": a["name"],
                "client": a["client"],
                "strategy": a["strategy"],
                "attempts": len(mine),
                "accepted": len(accepted),
                "rejected": sum(c["decision"] == "REJECT" for c in mine),
                "best": best["id"] if best else None,
                "score": best["score"] if best else None,
                "speedup_eager": best["speedup_eager"] if best else None,
                "latency_ms": best["latency_ms"] if best else None,
            }
        )
    rows.sort(key=lambda r: -(r["score"] or r["speedup_eager"] or 0))
    top = _run_best(cands)

    end = run.get("ended_at") or (cands[-1]["finished_at"] if cands else start)
    plot = _plot(cands, agents, start, end, out / "score_over_time.png")
    if top is not None:
        _export(top, out / "best")

    lines = [
        f"# Swarm run {run_id}",
        "",
        f"Problem `{run['problem']}`, {len(agents)} agent(s) with the {run['client']} client, "
        f"budget {run['budget_minutes']} min"
        + (f", at most {run['max_candidates']} candidates per agent" if run.get("max_candidates") else "")
        + f". {len(cands)} candidates judged.",
        "",
    ]
    if run.get("ended_reason"):
        lines += [f"Ended: {run['ended_reason']}.", ""]
    lines += [
        "## Leaderboard",
        "",
        "| rank | agent | client | strategy | attempts | accepted | rejected | best | SOL score | x eager | latency |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        lat = f"{r['latency_ms'] * 1e3:.1f} us" if r["latency_ms"] else "-"
        lines.append(
            f"| {i} | {r['agent']} | {r['client']} | {r['strategy']} | {r['attempts']} | {r['accepted']} | "
            f"{r['rejected']} | {r['best'] or '-'} | {_f(r['score'])} | {_f(r['speedup_eager'])} | {lat} |"
        )
    lines += [""]
    if plot:
        lines += ["## Score over time", "", f"![best score per agent]({plot.name})", ""]
    if top is not None:
        lines += [
            "## Best kernel",
            "",
            f"`{top['id']}` by {top['agent']} ({top['language']}): SOL score {_f(top['score'])}, "
            f"{_f(top['speedup_eager'])}x over eager. Exported to `best/solution.json`, "
            "its sources under `best/sources/`.",
            "",
        ]
    (out / "REPORT.md").write_text("\n".join(lines))
    (out / "leaderboard.json").write_text(json.dumps(rows, indent=2))
    return out / "REPORT.md"


def _f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _plot(cands: list[dict], agents: list[str], start: float, end: float, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    drawn = False
    for agent in agents:
        xs, ys, best = [], [], None
        for c in cands:
            if c["agent"] != agent or c["decision"] != "ACCEPT" or _metric(c) is None:
                continue
            best = _metric(c) if best is None else max(best, _metric(c))
            xs.append((c["finished_at"] - start) / 60)
            ys.append(best)
        if xs:
            ax.step(xs + [max(xs[-1], (end - start) / 60)], ys + [ys[-1]], where="post", label=agent)
            ax.plot(xs, ys, "o", color=ax.lines[-1].get_color())
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("minutes since the start of the run")
    ax.set_ylabel("best SOL score (else speedup over eager)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _export(cand: dict, folder: Path) -> None:
    """``solution.json`` as measured, and each source at its own path under ``sources/``: no
    source can overwrite the solution or another source (paths were checked when submitted;
    rows older than that check are checked again here)."""
    folder.mkdir(parents=True, exist_ok=True)
    solution = json.loads(cand["solution_json"])
    solution.setdefault("name", cand["id"])
    solution["author"] = cand["agent"]
    solution["definition"] = cand["problem"]
    (folder / "solution.json").write_text(json.dumps(solution, indent=2) + "\n")
    sources = folder / "sources"
    for src in solution["sources"]:
        try:
            path = sources / check_source_path(src["path"])
        except ValueError as exc:
            log.warning("%s: a source not exported (it is in solution.json): %s", cand["id"], exc)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src["content"])
