"""The ASGI application that answers MCP over streamable HTTP, built in the evaluating
process or, through ``create_app``, in each HTTP worker process."""

from __future__ import annotations

import json
import logging
import os

from guard.workspace import Workspace
from memory.conclusions import Retention

from ..server import build_server
from ..service import Service

ENV = "KERNELARC_SERVE_OPTIONS"
FACTORY = "kernelarc_mcp.serving.app:create_app"  # what uvicorn imports in a worker process


def build_app(service: Service, options: dict):
    mcp = build_server(
        service,
        http_auth=not options["allow_anonymous"],
        host=options["host"],
        port=options["port"],
        stdio_agent="anonymous" if options["allow_anonymous"] else None,
    )
    return mcp.streamable_http_app(host=options["host"], stateless_http=True)


def create_app():
    """Factory each HTTP worker process calls (options come through the environment)."""
    options = json.loads(os.environ[ENV])
    logging.basicConfig(level=options.get("log_level", logging.WARNING))
    ws = Workspace.open(options["workspace"])
    service = Service(
        ws,
        ws.config(),
        device=options["device"],
        retention=Retention(options["retention_days"], options["retention_per_problem"]),
        max_wait_s=options["max_wait"],
        evaluator=False,
        server=options.get("server"),
    )
    return build_app(service, options)
