"""How long a CUPTI session's start and stop take in a worker-like process, with Kineto's
CUPTI teardown at its default and with ``TEARDOWN_CUPTI=0``: the candidate worker opens one
session per timed workload, and a verdict's profile showed 137 ms in each stop.

Usage (on a GPU): ``python3 -m benchmarks.cupti_stop_probe [OUT_JSON]``. Each setting runs in
its own process, since Kineto reads the variable when it sets CUPTI up."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from benchmarks.harness import in_fresh_process

log = logging.getLogger("cupti_stop_probe")

SESSIONS = 8
REPLAYS = 100


def one_process() -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(2048, 2048, device="cuda")
    src = torch.randn_like(x)
    y = torch.empty_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.mul(x, 2.0, out=y)  # warm-up before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.mul(x, 2.0, out=y)
        y.add_(1.0)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]):  # the first session sets CUPTI up
        x.zero_()
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    rows = []
    for _ in range(SESSIONS):
        prof = profile(activities=[ProfilerActivity.CUDA])
        t0 = time.perf_counter()
        prof.start()
        t1 = time.perf_counter()
        for _ in range(REPLAYS):
            x.copy_(src)  # fresh data between replays, as the timed loop refills
            graph.replay()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        prof.stop()
        t3 = time.perf_counter()
        events = prof.profiler.kineto_results.events()
        t4 = time.perf_counter()
        kernels = sum(1 for e in events if e.device_type().name == "CUDA")
        launches = sum(1 for e in events if e.name() == "cudaGraphLaunch")
        rows.append(
            {
                "start_ms": (t1 - t0) * 1e3,
                "loop_ms": (t2 - t1) * 1e3,
                "stop_ms": (t3 - t2) * 1e3,
                "events_ms": (t4 - t3) * 1e3,
                "device_records": kernels,
                "graph_launches": launches,
            }
        )
    return {"first_session_s": first_s, "sessions": rows}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(one_process()))
        return 0
    out: dict[str, dict] = {}
    for label, value in (("default", None), ("TEARDOWN_CUPTI=0", "0")):
        env = dict(os.environ)
        env.pop("TEARDOWN_CUPTI", None)
        if value is not None:
            env["TEARDOWN_CUPTI"] = value
        res, failure = in_fresh_process("benchmarks.cupti_stop_probe", env)
        if res is None:
            log.info("%s: failed\n%s", label, failure)
            continue
        out[label] = res
        s = res["sessions"]
        med = {k: sorted(r[k] for r in s)[len(s) // 2] for k in s[0]}
        log.info(
            "%-18s first %.2f s | median start %.1f loop %.1f stop %.1f events %.1f ms | records %d launches %d",
            label,
            res["first_session_s"],
            med["start_ms"],
            med["loop_ms"],
            med["stop_ms"],
            med["events_ms"],
            med["device_records"],
            med["graph_launches"],
        )
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
