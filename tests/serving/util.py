"""Starting a real `kernelarc serve` process for the tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAST = {"compile_baseline": False, "min_iters": 3, "max_iters": 10, "target_time_s": 0.01,
        "warmup_time_s": 0.0, "correctness_rounds": 1, "call_timeout_s": 20}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kernelarc(ws: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelarc_mcp.cli", "--workspace", str(ws), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout)


def fast_workspace(ws: Path) -> Path:
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "config.json").write_text(json.dumps(FAST))
    return ws


def token(ws: Path, agent: str) -> str:
    out = kernelarc(ws, "token", "create", agent, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])["token"]


class HttpServer:
    """`kernelarc serve --transport http` in a subprocess; ``ready_s`` is how long the
    port took to accept connections."""

    def __init__(self, ws: Path, *extra: str):
        self.port = free_port()
        self.log = open(ws / f"serve-{self.port}.log", "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kernelarc_mcp.cli", "--workspace", str(ws), "serve", "--transport", "http",
             "--port", str(self.port), "--device", "cpu", *extra],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {(ws / f'serve-{self.port}.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        self.ready_s = time.monotonic() - t0
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
