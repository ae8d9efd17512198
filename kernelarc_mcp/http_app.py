"""Serving MCP over streamable HTTP, in one process or several.

The HTTP layer is stateless (each request carries its bearer token; no sessions), so any
number of worker processes can answer. Exactly one process evaluates: the one that runs
``serve_http`` owns the job queue and the guard's GPU workers; the HTTP workers only read
the workspace and put submissions in the queue (the database), then wait for the verdict
there. With ``workers=1`` the same process does both.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os

from memory.conclusions import Retention

ENV = "KERNELARC_SERVE_OPTIONS"
log = logging.getLogger(__name__)


def _uvicorn_speedups() -> dict:
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
    """Serve until interrupted; ``service`` is the evaluating one (this process)."""
    import uvicorn

    common = dict(host=options["host"], port=options["port"], log_level="warning", access_log=False,
                  **_uvicorn_speedups())
    if workers <= 1:
        uvicorn.run(build_app(service, options), **common)
        return
    os.environ[ENV] = json.dumps(options)
    uvicorn.run("kernelarc_mcp.http_app:create_app", factory=True, workers=workers, **common)
