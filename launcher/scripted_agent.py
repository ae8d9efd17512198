"""The scripted agent: a real MCP client over streamable HTTP that needs no model.

It reads the problem, starts from a seed its strategy prefers and proposes variants: other
launch configurations (``num_warps``, ``num_stages``, Triton tile sizes, given as numbers or
set by name), other seeds, the reference in plain PyTorch. It submits them (never the same
source twice), climbs from each variant the guard accepts to that variant's own variants,
records what it learns as conclusions with their evidence, looks at its peers' best and
adopts it when it leads, and follows the guard's advice: a redraft switches to another
starting point, stop ends it. Deterministic for a given problem and strategy. Run by the
launcher: ``python -m launcher.scripted_agent --url URL --problem P`` with the token in
``$KERNELARC_TOKEN``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time

import anyio

log = logging.getLogger("scripted")

KNOBS = {
    "num_warps": [4, 8, 2, 16, 1],
    "num_stages": [3, 2, 4, 1],
}
# tile sizes of Triton launches given as numbers (``BLOCK=4096``): tried at half, double, a
# quarter and four times their value; a size the kernel cannot take is the guard's to reject
TILES = ("BLOCK", "BLOCK_SIZE", "BLOCK_M", "BLOCK_N", "BLOCK_K", "BM", "BN", "BK")
TILE_FACTORS = (0.5, 2, 0.25, 4)
TILE_RANGE = (16, 65536)
PREFERRED_START = {
    "tiling_autotune": ["seed_triton.py", "reference", "seed_cuda.cu"],
    "memory_fusion": ["seed_triton.py", "seed_cuda.cu", "reference"],
    "library_precision": ["reference", "seed_triton.py", "seed_cuda.cu"],
    "algorithm_redraft": ["seed_cuda.cu", "reference", "seed_triton.py"],
    "profile_micro": ["seed_triton.py", "reference", "seed_cuda.cu"],
}


def _tile_values(current: int) -> list[int]:
    values = [int(current * f) for f in TILE_FACTORS]
    return [v for v in values if TILE_RANGE[0] <= v <= TILE_RANGE[1] and v & (v - 1) == 0]


def variants(source: str) -> list[tuple[str, str]]:
    """Other launch configurations of a source, one change each: (new source, what changed)."""
    out = []
    # a CUDA kernel's tile constants are tied to each other and to its thread layout (the
    # seeds load both tiles with one loop): changing one alone breaks the kernel
    tiles = "__global__" not in source
    options = [(knob, lambda cur, vs=values: vs) for knob, values in KNOBS.items()]
    if tiles:
        options += [(tile, _tile_values) for tile in TILES]
    for knob, values_for in options:
        for m in re.finditer(rf"\b{knob}\s*=\s*(\d+)\b", source):
            current = int(m.group(1))
            for v in values_for(current):
                if v != current:
                    new = source[: m.start(1)] + str(v) + source[m.end(1) :]
                    out.append((new, f"{knob} {current} -> {v}"))
    if tiles:
        out += _tile_tuple_variants(source)
    return out


def _tile_tuple_variants(source: str) -> list[tuple[str, str]]:
    """Tiles set in one assignment and passed on by name (``bm, bn, bk = 64, 64, 32`` then
    ``BM=bm, BN=bn, BK=bk``): each one halved and doubled."""
    out = []
    for m in re.finditer(
        r"^[ \t]*(\w+(?:[ \t]*,[ \t]*\w+)+)[ \t]*=[ \t]*(\d+(?:[ \t]*,[ \t]*\d+)+)[ \t]*$", source, flags=re.M
    ):
        names = [n.strip() for n in m.group(1).split(",")]
        values = [int(v) for v in m.group(2).split(",")]
        if len(names) != len(values):
            continue
        for i, (name, current) in enumerate(zip(names, values)):
            tile = re.search(rf"\b({'|'.join(TILES)})\s*=\s*{name}\b", source)
            if tile is None:
                continue
            for v in _tile_values(current)[:2]:  # half and double
                new_values = ", ".join(str(v if j == i else x) for j, x in enumerate(values))
                new = source[: m.start(2)] + new_values + source[m.end(2) :]
                out.append((new, f"{tile.group(1)} {current} -> {v}"))
    return out


class Agent:
    def __init__(
        self, client, problem: str, strategy: str, name: str, max_candidates: int | None, budget_s: float | None
    ):
        self.c = client
        self.problem = problem
        self.strategy = strategy
        self.name = name
        self.max_candidates = max_candidates
        self.deadline = time.monotonic() + budget_s if budget_s else None
        self.submitted = 0
        self.tried: set[str] = set()  # sources submitted, so no variant is judged twice

    async def tool(self, name: str, **args):
        r = await self.c.call_tool(name, args)
        if r.is_error:
            raise RuntimeError(f"{name}: {r.content[0].text if r.content else 'error'}")
        return r.structured_content

    def out_of_budget(self) -> bool:
        if self.max_candidates is not None and self.submitted >= self.max_candidates:
            return True
        return self.deadline is not None and time.monotonic() > self.deadline

    async def submit(self, source: str, language: str | None, notes: str):
        res = await self.tool("submit_candidate", problem=self.problem, source=source, language=language, notes=notes)
        while res["state"] in ("queued", "running"):
            res = await self.tool("get_result", job_id=res["job_id"], wait_s=40)
        self.submitted += 1
        return res

    def starts(self, problem_view: dict, device: str) -> list[tuple[str, str | None, str]]:
        """Starting points in the strategy's order: (label, language, source)."""
        seeds = problem_view.get("seed_kernels", {})  # left out where empty (the compact encoding)
        pool = {"reference": ("pytorch", problem_view["reference"])}
        for fname, src in seeds.items():
            lang = "cuda_cpp" if fname.endswith((".cu", ".cpp")) else None
            if lang == "cuda_cpp" and not device.startswith("cuda"):
                continue  # CUDA C++ cannot run on a guard without a GPU
            pool[fname] = (lang, src)
        order = PREFERRED_START.get(self.strategy, list(pool))
        names = [n for n in order if n in pool] + [n for n in pool if n not in order]
        return [(n, pool[n][0], pool[n][1]) for n in names]

    async def run(self) -> None:
        view = await self.tool("get_problem", problem=self.problem, detail="full")  # with the seeds' source
        status = await self.tool("status")
        device = status["device"]["kind"]
        starts = self.starts(view, device)
        log.info("%s: %d starting points on %s", self.name, len(starts), device)
        queue: list[tuple[str | None, str, str]] = []
        start_index = 0
        mine: str | None = None
        while not self.out_of_budget():
            if not queue:
                if start_index >= len(starts):
                    log.info("%s: nothing left to try", self.name)
                    return
                label, lang, src = starts[start_index]
                start_index += 1
                queue = [(lang, src, f"start from {label}")] + [(lang, s, n) for s, n in variants(src)]
            lang, src, notes = queue.pop(0)
            if src in self.tried:
                continue
            self.tried.add(src)
            res = await self.submit(src, lang, f"[{self.strategy}] {notes}")
            v = res.get("verdict")
            if res["state"] != "done" or v is None:
                log.warning("%s: evaluation failed: %s", self.name, res.get("message"))
                continue
            log.info("%s: %s %s (%s)", self.name, v["decision"], v["status"], notes)
            cid = v["candidate_id"]
            if v["decision"] == "ACCEPT":
                mine = cid
                # climb: the new best's own variants come next
                queue = [(lang, s, f"{n} (on my best {cid})") for s, n in variants(src) if s not in self.tried] + queue
                speed = v.get("speedup_vs_best")
                if speed:
                    text = f"{notes}: correct and faster ({speed:.2f}x over my previous best)"
                else:  # my first correct kernel: nothing of mine to be faster than
                    text = (
                        f"{notes}: correct, my first working kernel "
                        f"({v.get('speedup_eager') or 0:.2f}x of eager's speed)"
                    )
                await self._record(text, "insight", cid)
            elif v["decision"] == "REJECT":
                await self._record(f"{notes}: rejected, {v['status']}: {v['reason'][:200]}", "pitfall", cid)
            elif v["decision"] == "REVERT" and v.get("speedup_vs_best"):
                await self._record(f"{notes}: slower ({v['speedup_vs_best']:.2f}x of the best)", "pitfall", cid)
            action = v["advice"]["action"]
            if action == "stop":
                log.info("%s: the guard says stop: %s", self.name, v["advice"]["message"])
                return
            if action == "redraft":
                log.info("%s: redraft: switching to another starting point", self.name)
                queue = []
                continue
            if self.submitted % 3 == 0:
                queue = await self._learn_from_peers(mine, queue)

    async def _record(self, text: str, kind: str, evidence: str) -> None:
        try:
            await self.tool(
                "record", problem=self.problem, text=text[:900], kind=kind, evidence=evidence, tags=[self.strategy]
            )
        except RuntimeError as exc:
            log.warning("%s: record refused: %s", self.name, exc)

    async def _learn_from_peers(self, mine: str | None, queue: list) -> list:
        """Adopt the global best as the next base when it is someone else's."""
        peek = await self.tool("peek_best", problem=self.problem, k=3)
        best = peek.get("global_best")
        if not best or best["candidate_id"] == mine or best["agent"] == self.name or not best["source"]:
            return queue
        entry = (best.get("entry_point") or "").split("::")[0]  # the file the guard ran, not the first
        fname, src = (entry, best["source"][entry]) if entry in best["source"] else next(iter(best["source"].items()))
        lang = best.get("language")
        lang = "cuda_cpp" if lang == "cuda_cpp" or fname.endswith((".cu", ".cpp")) else lang
        log.info("%s: adopting %s from %s", self.name, best["candidate_id"], best["agent"])
        return [(lang, s, f"{n} (from {best['agent']}'s {best['candidate_id']})") for s, n in variants(src)] + queue


async def main_async(args) -> int:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    token = os.environ.get("KERNELARC_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(180.0)) as http:
        async with Client(streamable_http_client(args.url, http_client=http), mode="legacy") as c:
            agent = Agent(c, args.problem, args.strategy, args.name, args.max_candidates, args.budget_s)
            await agent.run()
            log.info("%s: done after %d submissions", args.name, agent.submitted)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=os.environ.get("KERNELARC_URL"))
    ap.add_argument("--problem", required=True)
    ap.add_argument("--strategy", default="tiling_autotune")
    ap.add_argument("--name", default="scripted")
    ap.add_argument("--max-candidates", type=int)
    ap.add_argument("--budget-s", type=float)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    for noisy in ("httpx", "httpx2", "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.url:
        ap.error("--url (or $KERNELARC_URL) is required")
    return anyio.run(main_async, args)


if __name__ == "__main__":
    sys.exit(main())
