"""The tables ``kernelarc profile`` and ``kernelarc verify`` print, as headers and rows, so
the terminal and the Markdown in docs/ show the same numbers."""

from __future__ import annotations

import statistics

from guard.printable import printable

from .profile import FACTORS, Profile
from .verify import Verification

Table = tuple[list[str], list[list]]


def _shape(axes: dict | None) -> str:
    return "-" if axes is None else " ".join(f"{k}={v}" for k, v in axes.items())


def _calls(n: float):
    if not n:
        return "-"
    return int(n) if float(n).is_integer() else round(n, 2)


def profile_heading(p: Profile) -> str:
    return (
        f"{p.model} on {p.device}, {p.dtype}: one forward takes {p.forward_ms:.3f} ms (median, outside the "
        f"profiler); the profiler saw {p.profiled_ms:.3f} ms of op time per forward "
        f"({'device' if p.device == 'cuda' else 'CPU'} time, mean of {p.reps})"
    )


def kernel_table(p: Profile, limit: int = 15) -> Table:
    gpu = any(e.kernels for e in p.entries)
    headers = ["rank", "family", "where", "shape", "calls", "ms", "share"] + [f"model x{f:g}" for f in FACTORS]
    headers += ["main GPU kernel"] if gpu else []
    rows = []
    for i, e in enumerate(p.entries[:limit], 1):
        where = e.where
        if not (e.pluggable or where.startswith("aten::") or "(outside" in where):
            where += " (no kernel site)"
        row = [
            i,
            e.family,
            where,
            _shape(e.axes),
            _calls(e.calls),
            round(e.time_ms, 4),
            f"{e.share:.1%}",
            *(f"{e.amdahl(f):.3f}" for f in FACTORS),
        ]
        if gpu:
            main = max(e.kernels, key=e.kernels.get, default="-")
            row.append(main if len(main) <= 48 else main[:45] + "...")
        rows.append(row)
    return headers, rows


def family_table(p: Profile) -> Table:
    return ["family", "ms", "share"], [[f, round(t, 4), f"{s:.1%}"] for f, t, s in p.by_family()]


def _ms(values: list[float]) -> float | None:
    return statistics.median(values) * 1e3 if values else None


def verify_table(v: Verification) -> Table:
    headers = ["kernel", "from", "calls served", "calls declined", "model's ms there", "kernel ms", "x at its calls"]
    rows = []
    for name, u in v.total.use.items():
        own, mine = _ms(u.own_s), _ms(u.kernel_s)
        ratio = f"{own / mine:.3f}" if own and mine else "-"
        rows.append([name, v.origins.get(name, "-"), u.served, u.declined, own, mine, ratio])
    return headers, rows


def verify_summary(v: Verification) -> list[str]:
    t = v.total
    check = t.check
    hi = "float64" if v.dtype in ("float32", "float64") else "float32"
    lines = [
        f"{v.model} on {v.device}, {v.dtype}, {len(t.kernels)} kernel(s) plugged in:",
        f"  output error vs the model in {hi}: {check.status}: relative L2 {check.plugged.rel_l2:.3g} "
        f"(the model's own {check.own.rel_l2:.3g}, limit {check.limit_rel_l2:.3g}), max abs "
        f"{check.plugged.max_abs:.3g} (own {check.own.max_abs:.3g}, limit {check.limit_max_abs:.3g})",
        f"  forward: model {t.own_ms:.3f} ms, with the kernels {t.plugged_ms:.3f} ms: "
        f"x{t.speedup:.3f} (medians of {v.reps}, measured in alternation)",
    ]
    if not check.ok:
        lines.append(f"  FAILED: {check.message}")
    unused = [n for n, u in t.use.items() if u.served == 0]
    if unused:
        lines.append(f"  NOT USED (no call fits the kernel's problem): {', '.join(unused)}")
    return lines


def diagnose_table(v: Verification) -> Table:
    headers = [
        "kernel alone",
        "calls served",
        "output",
        "rel L2 error",
        "max abs error",
        "model ms",
        "plugged ms",
        "model x",
    ]
    rows = [
        [
            t.kernels[0],
            next(iter(t.use.values())).served,
            t.check.status,
            t.check.plugged.rel_l2,
            t.check.plugged.max_abs,
            round(t.own_ms, 4),
            round(t.plugged_ms, 4),
            f"{t.speedup:.3f}",
        ]
        for t in v.alone
    ]
    return headers, rows


def markdown(table: Table) -> str:
    headers, rows = table
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _cell(c) -> str:
    """A Markdown cell: printable, and no markup of its own (an origin names a path an agent
    may have chosen; a viewer would load an image or follow a link written into it)."""
    if c is None:
        return "-"
    if isinstance(c, float):
        return f"{c:.4g}"
    text = printable(str(c))
    for ch in "\\`[]<>|":
        text = text.replace(ch, "\\" + ch)
    return text
