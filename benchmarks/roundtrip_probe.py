"""What one request and its reply cost between the guard and a worker process on this machine:
the figure a CPU outside clock with one call per request would add to every call of both
windows (docs/guard.md, fifth round: the loop the candidate cannot restructure). Two processes
over a socket pair, as the guard and its workers are: the guard's own framing
(``runner.protocol``) with a small message, and a bare 8-byte exchange for comparison. Prints
the median and the 90th percentile in microseconds.

    python -m benchmarks.roundtrip_probe [--n 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

from guard.runner import protocol


def _echo(sock: socket.socket, framed: bool) -> None:
    """The worker's side: answer every request until told to stop."""
    while True:
        if framed:
            msg = protocol.recv(sock)
            if msg.get("op") == "exit":
                return
            protocol.send(sock, {"ok": True, "it": msg["it"]})
        else:
            data = sock.recv(8)
            if not data or data == b"exit\0\0\0\0":
                return
            sock.sendall(data)


def _measure(n: int, framed: bool) -> list[float]:
    guard_side, worker_side = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        guard_side.close()
        _echo(worker_side, framed)
        os._exit(0)
    worker_side.close()
    times = []
    for it in range(n):
        t0 = time.perf_counter_ns()
        if framed:
            protocol.send(guard_side, {"op": "call", "it": it, "seed": 12345})
            protocol.recv(guard_side)
        else:
            guard_side.sendall(it.to_bytes(8, "little"))
            guard_side.recv(8)
        times.append((time.perf_counter_ns() - t0) / 1e3)
    if framed:
        protocol.send(guard_side, {"op": "exit"})
    else:
        guard_side.sendall(b"exit\0\0\0\0")
    os.waitpid(pid, 0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    out = {}
    for name, framed in (("protocol", True), ("bare", False)):
        t = sorted(_measure(args.n, framed))
        out[name] = {"median_us": round(statistics.median(t), 1), "p90_us": round(t[int(0.9 * len(t))], 1)}
    print(json.dumps({"n": args.n, "cpus": os.cpu_count(), **out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
