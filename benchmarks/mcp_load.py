"""Load on the MCP server: concurrent clients calling recall and peek_best against a
workspace of 100k conclusions and 10k candidates, over streamable HTTP with bearer tokens.

Usage: python -m benchmarks.mcp_load OUT_DIR [--clients 16] [--calls 200]
Writes OUT_DIR/mcp_load.json and prints a summary; the figures go to docs/mcp_load.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import procfs  # noqa: E402

PROBLEMS = ["rmsnorm_llama3_8b", "softmax_lm_vocab_fp32", "matmul_bf16_llm_projections", "layernorm_gpt2_bf16"]
DOMAIN = (
    "tile block warp vector load store coalesce fuse epilogue split reduce persistent autotune "
    "stages pipeline shared memory bank conflict register spill occupancy launch overhead rows "
    "columns float32 accumulate bfloat16 rounding tail mask stride layout transpose swizzle l2 "
    "cache prefetch tma wgmma cluster online softmax welford rsqrt exp2 mean variance"
).split()
# Conclusions are short technical sentences: a vocabulary of a few thousand terms whose
# frequencies fall off like natural text (Zipf), the domain words most frequent.
WORDS = DOMAIN + [f"term{i:04d}" for i in range(3000)]
_ZIPF = [1.0 / (r + 1) for r in range(len(WORDS))]


def words(rng: random.Random, n: int) -> list[str]:
    return rng.choices(WORDS, weights=_ZIPF, k=n)


def populate(ws_path: Path, n_candidates: int, n_conclusions: int, agents: list[str]) -> None:
    from guard.archive.db import Database
    from guard.verdict import Advice, Verdict, WorkloadResult
    from memory import conclusions as C
    from memory.store import Memory

    db = Database(ws_path / "workspace.db")
    Memory(db)
    rng = random.Random(7)
    from guard.workspace import Workspace

    store = Workspace.open(ws_path).problems()
    hashes = {p: store.get(p).definition.content_hash() for p in PROBLEMS}
    from guard.runner.device import resolve

    device = resolve("cpu")
    source = (REPO / "seeds" / "rmsnorm_llama3_8b" / "seed_triton.py").read_text()
    solution = json.dumps(
        {
            "spec": {
                "languages": ["triton", "pytorch"],
                "entry_point": "kernel.py::run",
                "destination_passing_style": False,
            },
            "sources": [{"path": "kernel.py", "content": source}],
        }
    )
    now = time.time()
    with db.transaction() as c:
        for i in range(n_candidates):
            p = PROBLEMS[i % len(PROBLEMS)]
            agent = agents[i % len(agents)]
            decision = rng.choice(["ACCEPT", "KEEP", "REVERT", "REJECT", "REJECT"])
            lat = rng.uniform(0.01, 1.0)
            wls = [
                WorkloadResult(
                    uuid=f"w{j}",
                    axes={"n": 2**j},
                    latency_ms=lat * (j + 1),
                    eager_ms=lat * 2 * (j + 1),
                    sol_ms=lat * 0.3,
                    rel_se=0.003,
                )
                for j in range(8)
            ]
            cid = f"c-load{i:06d}"
            v = Verdict(
                candidate_id=cid,
                problem=p,
                agent=agent,
                decision=decision,
                status="PASSED" if decision != "REJECT" else "INCORRECT_NUMERICAL",
                reason="synthetic",
                advice=Advice(action="continue", message="continue"),
                workloads=[] if decision == "REJECT" else wls,
                score=rng.random(),
                speedup_eager=rng.uniform(0.5, 3),
                sol_fraction=rng.random(),
                latency_ms=lat,
            )
            c.execute(
                "INSERT INTO candidates (id, problem, definition_hash, agent, language, source_hash, solution_json,"
                " device_key, device_kind, state, decision, status, reason, score, speedup_eager, sol_fraction,"
                " latency_ms, global_best, verdict_json, created_at, finished_at) VALUES"
                " (?,?,?,?,?,?,?,?,?,'done',?,?,?,?,?,?,?,?,?,?,?)",
                (
                    cid,
                    p,
                    hashes[p],
                    agent,
                    "triton",
                    f"h{i}",
                    solution,
                    device.key,
                    "cpu",
                    decision,
                    v.status,
                    "synthetic",
                    v.score,
                    v.speedup_eager,
                    v.sol_fraction,
                    lat,
                    int(decision == "ACCEPT" and i % 97 == 0),
                    v.model_dump_json(),
                    now - (n_candidates - i),
                    now - (n_candidates - i),
                ),
            )
            if decision != "REJECT":
                for w in wls:
                    c.execute(
                        "INSERT INTO workload_results (candidate_id, workload, latency_ms, eager_ms, sol_ms,"
                        " rel_se, result_json) VALUES (?,?,?,?,?,?,?)",
                        (cid, w.uuid, w.latency_ms, w.eager_ms, w.sol_ms, w.rel_se, w.model_dump_json()),
                    )
        for i in range(n_conclusions):
            p = PROBLEMS[i % len(PROBLEMS)]
            text = " ".join(words(rng, rng.randint(6, 18)))
            C.insert(
                c,
                problem=p,
                op_family=p.split("_")[0],
                agent=agents[i % len(agents)],
                kind=rng.choice(["insight", "pitfall"]),
                text=text,
                tags=words(rng, 1),
                evidence=f"c-load{rng.randrange(n_candidates):06d}",
                evidence_decision="ACCEPT",
                strength=rng.random(),
                created_at=now - rng.uniform(0, 30 * 86400),
                updated_at=now - rng.uniform(0, 30 * 86400),
            )


def client_main(url: str, tok: str, calls: int, seed: int, queue, nodelay: bool = False) -> None:
    """One client: the MCP handshake, then ``calls`` tool calls over plain HTTP. Requests
    are built and answers parsed with the standard library, so the client spends little CPU
    of its own and the timings are the server's (16 SDK clients would load a 2-core machine
    as much as the server does). ``nodelay``: the client's socket sends at once (TCP_NODELAY).
    Without it the HTTP library writes a request's headers and body separately, and the body
    may wait for the server to acknowledge the headers (Nagle's algorithm meeting a delayed
    acknowledgement: up to 40 ms on Linux), which is the client's latency, not the server's."""
    import socket

    import httpx2

    rng = random.Random(seed)
    lat = {"recall": [], "peek_best": []}
    errors = []
    headers = {
        "Authorization": f"Bearer {tok}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
    }
    cpu0 = time.process_time()
    transport = httpx2.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)] if nodelay else None)
    with httpx2.Client(headers=headers, timeout=60, transport=transport) as http:
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "load", "version": "1"},
            },
        }
        r = http.post(url, json=init)
        session = r.headers.get("mcp-session-id")
        h = {"mcp-session-id": session, "mcp-protocol-version": "2025-06-18"} if session else {}
        http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
        for i in range(calls):
            p = rng.choice(PROBLEMS)
            if i % 2 == 0:
                tool, args = (
                    "recall",
                    {
                        "problem": p,
                        "query": " ".join(words(rng, 3)),
                        "scope": rng.choice(["problem", "family", "any"]),
                        "k": 8,
                    },
                )
            else:
                tool, args = "peek_best", {"problem": p, "k": 3}
            body = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {"name": tool, "arguments": args}}
            t0 = time.perf_counter()
            try:
                resp = http.post(url, json=body, headers=h)
                text = resp.text
                payload = next((ln[5:] for ln in text.splitlines() if ln.startswith("data:")), text)
                msg = json.loads(payload)
                if resp.status_code != 200 or "error" in msg or msg["result"].get("isError"):
                    errors.append(payload[:200])
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
            lat[tool].append((time.perf_counter() - t0) * 1e3)
    queue.put({"lat": lat, "errors": errors, "cpu_s": time.process_time() - cpu0})


# -- where the server's work went: its processes, their CPU time and connections ----------------
def cpu_seconds(pids) -> dict[int, float]:
    return {pid: cpu for pid in pids if (cpu := procfs.cpu_seconds(pid)) is not None}


def connections(port: int, pids) -> dict[int, set[int]]:
    """The established TCP connections to ``port``, as client ports, by the process that holds them."""
    remote = procfs.tcp_sockets(port, procfs.ESTABLISHED)
    return {pid: {remote[i] for i in procfs.socket_inodes(pid) if i in remote} for pid in pids}


def settle(root: int, workers: int, timeout: float = 120.0) -> float:
    """Wait until the server's HTTP worker processes (with ``workers`` > 1) exist and have
    finished starting (no CPU spent for half a second), so that no client connects while only
    some of them can accept; returns the seconds waited."""
    t0 = time.monotonic()
    if workers <= 1 or not os.path.isdir("/proc"):
        return 0.0
    before: dict[int, float] = {}
    while time.monotonic() - t0 < timeout:
        http = [pid for pid, role in procfs.process_roles(root).items() if role == "http worker"]
        now = cpu_seconds(http)
        if len(now) >= workers and all(pid in before and now[pid] - before[pid] < 0.02 for pid in now):
            break
        before = now
        time.sleep(0.5)
    return time.monotonic() - t0


class ProcessWatch:
    """Samples, while the clients run, which server process holds each client connection."""

    def __init__(self, root: int, port: int, every_s: float = 0.2):
        self.roles = procfs.process_roles(root)
        self.port, self.every_s = port, every_s
        self.clients: dict[int, set[int]] = {pid: set() for pid in self.roles}
        self._stop = threading.Event()
        self._cpu0 = cpu_seconds(self.roles)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for pid, ports in connections(self.port, self.roles).items():
                self.clients[pid] |= ports

    def finish(self) -> list[dict]:
        self._stop.set()
        self._thread.join()
        cpu1 = cpu_seconds(self.roles)
        return [
            {
                "pid": pid,
                "role": role,
                "cpu_s": round(cpu1.get(pid, 0.0) - self._cpu0.get(pid, 0.0), 2),
                "connections": len(self.clients[pid]),
            }
            for pid, role in sorted(self.roles.items())
        ]


def _spin(seconds: float) -> float:
    """Burn ``seconds`` of this process's CPU; return them."""
    t0 = time.process_time()
    while time.process_time() - t0 < seconds:
        pass
    return time.process_time() - t0


def cpu_capacity(processes: int, seconds: float = 1.0) -> float:
    """How many cores this machine really gives at once: ``processes`` busy loops of
    ``seconds`` CPU each, total CPU over wall time (a VM's or cgroup's limit shows here, where
    os.cpu_count() does not)."""
    with mp.get_context("spawn").Pool(processes) as pool:
        pool.map(_spin, [0.01] * processes)  # processes started before the clock
        t0 = time.perf_counter()
        burnt = sum(pool.map(_spin, [seconds] * processes, chunksize=1))
        return burnt / (time.perf_counter() - t0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def one_round(ws: Path, toks: dict[str, str], args, nodelay: bool) -> dict:
    """Start the server, run every client to the end, stop the server; the figures."""
    from benchmarks.harness import HttpServer

    srv = HttpServer(ws, "--workers", str(args.workers))
    try:
        settle_s = settle(srv.proc.pid, args.workers)
        watch = ProcessWatch(srv.proc.pid, srv.port)
        q = mp.get_context("spawn").Queue()
        procs = [
            mp.get_context("spawn").Process(target=client_main, args=(srv.url, tok, args.calls, i, q, nodelay))
            for i, tok in enumerate(toks.values())
        ]
        t0 = time.time()
        for p in procs:
            p.start()
        results = [q.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join()
        wall = time.time() - t0
        processes = watch.finish()
    finally:
        srv.stop()
    lat = {"recall": [], "peek_best": []}
    errors = []
    for r in results:
        for k in lat:
            lat[k] += r["lat"][k]
        errors += r["errors"]
    every = lat["recall"] + lat["peek_best"]
    return {
        "client_tcp_nodelay": nodelay,
        "server_ready_s": srv.ready_s,
        "workers_settled_s": settle_s,
        "wall_s": wall,
        "calls": len(every),
        "errors": len(errors),
        "error_samples": errors[:5],
        "throughput_per_s": len(every) / wall,
        **{f"{k}_p50_ms": pct(v, 0.5) for k, v in lat.items()},
        **{f"{k}_p99_ms": pct(v, 0.99) for k, v in lat.items()},
        "all_p50_ms": pct(every, 0.5),
        "all_p99_ms": pct(every, 0.99),
        "all_mean_ms": statistics.fmean(every),
        # the clients' own CPU per call (handshake included): their share of the measured latency
        "client_cpu_ms_per_call": 1e3 * sum(r["cpu_s"] for r in results) / max(1, len(every)),
        # per server process: CPU seconds spent while the clients ran, client connections it held
        "server_processes": processes,
        "connections_per_http_process": [p["connections"] for p in processes if p["connections"]],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--conclusions", type=int, default=100_000)
    ap.add_argument("--candidates", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=1, help="HTTP worker processes of the server")
    ap.add_argument(
        "--nodelay",
        choices=["off", "on", "both"],
        default="off",
        help="clients set TCP_NODELAY (both: one round each on the same workspace;"
        " the second is written to mcp_load_nodelay.json)",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from benchmarks.harness import fast_workspace, token
    from kernelarc_mcp.serving.sockets import uvicorn_speedups

    capacity = cpu_capacity(os.cpu_count() or 1)
    print(f"CPU capacity: {capacity:.1f} cores busy at once (os.cpu_count() {os.cpu_count()})", flush=True)
    ws = fast_workspace(Path(tempfile.mkdtemp(prefix="mcp-load-")) / "ws")
    agents = [f"agent{i:02d}" for i in range(args.clients)]
    t0 = time.time()
    populate(ws, args.candidates, args.conclusions, agents)
    populate_s = time.time() - t0
    toks = {a: token(ws, a) for a in agents}
    rounds = {"off": [False], "on": [True], "both": [False, True]}[args.nodelay]
    for nodelay in rounds:
        summary = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} ({os.cpu_count()} cores), Python {platform.python_version()}",
            "cores_usable_at_once": capacity,
            "server_http_stack": uvicorn_speedups(),  # uvloop and httptools when installed
            "clients": args.clients,
            "calls_per_client": args.calls,
            "server_workers": args.workers,
            "conclusions": args.conclusions,
            "candidates": args.candidates,
            "populate_s": populate_s,
            **one_round(ws, toks, args, nodelay),
        }
        name = "mcp_load_nodelay.json" if nodelay and args.nodelay == "both" else "mcp_load.json"
        (args.out / name).write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
