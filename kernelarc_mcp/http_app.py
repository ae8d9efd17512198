"""Serving MCP over streamable HTTP, in one process or several.

The HTTP layer is stateless (each request carries its bearer token; no sessions), so any
number of worker processes can answer. Exactly one process evaluates: the one that runs
``serve_http`` owns the job queue and the guard's GPU workers; the HTTP workers only read
the workspace and put submissions in the queue (the database), then wait for the verdict
there. With ``workers=1`` the same process does both.

With several HTTP workers this process accepts the connections and hands each to the worker
that holds the fewest: ``http_workers.py``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import socket

from memory.conclusions import Retention

ENV = "KERNELARC_SERVE_OPTIONS"
STARTUP_FAILURE = 3  # uvicorn's exit status when a server cannot start
log = logging.getLogger(__name__)


def uvicorn_speedups() -> dict:
    fast = importlib.util.find_spec("uvloop") and importlib.util.find_spec("httptools")
    return {"loop": "uvloop" if fast else "asyncio", "http": "httptools" if fast else "h11"}


def build_app(service, options: dict):
    from .server import build_server

    mcp = build_server(service, http_auth=not options["allow_anonymous"], host=options["host"],
                       port=options["port"], stdio_agent="anonymous" if options["allow_anonymous"] else None)
    return mcp.streamable_http_app(host=options["host"], stateless_http=True)


def create_app():
    """Factory each HTTP worker process calls (options come through the environment)."""
    from guard.workspace import Workspace

    from .service import Service

    options = json.loads(os.environ[ENV])
    logging.basicConfig(level=options.get("log_level", logging.WARNING))
    ws = Workspace.open(options["workspace"])
    service = Service(ws, ws.config(), device=options["device"],
                      retention=Retention(options["retention_days"], options["retention_per_problem"]),
                      max_wait_s=options["max_wait"], evaluator=False)
    return build_app(service, options)


def serve_http(service, options: dict, workers: int) -> None:
    """Serve until interrupted (SIGINT or SIGTERM); ``service`` is the evaluating one (this
    process). With ``workers`` > 1 this process serves no HTTP itself: it accepts the
    connections and hands each to the HTTP worker that holds the fewest."""
    import uvicorn

    # ws="none": MCP needs no websockets, and an upgraded connection would escape the
    # dispatcher's count of each worker's connections
    common = dict(host=options["host"], port=options["port"], log_level="warning", access_log=False, ws="none",
                  **uvicorn_speedups())
    if workers <= 1:
        # uvicorn shuts down gracefully on SIGTERM, then raises the signal again: as an exit,
        # so that the caller still closes the service (its guard workers, its job threads)
        signal.signal(signal.SIGTERM, _exit_quietly)
        uvicorn.run(build_app(service, options), **common)
        return
    os.environ[ENV] = json.dumps(options)
    if not (hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX")):
        # no descriptor passing (Windows): one socket shared by uvicorn's workers
        uvicorn.run("kernelarc_mcp.http_app:create_app", factory=True, workers=workers, **common)
        return
    from .http_workers import Workers

    Workers(options["host"], options["port"], workers, common).run()


def _exit_quietly(*_) -> None:
    raise SystemExit(0)


def check_port_free(host: str, port: int) -> None:
    """Raise OSError when something listens on ``host:port`` (port 0 is always free). Called
    before the server touches the workspace, so that a second server started by mistake
    changes nothing (it would re-queue the running server's evaluations)."""
    if not port:
        return
    with socket.socket(address_family(host)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def address_family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
