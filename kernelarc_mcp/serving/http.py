"""Serving MCP over streamable HTTP, in one process or several.

The HTTP layer is stateless (each request carries its bearer token; no sessions), so any
number of worker processes can answer. Exactly one process evaluates: the one that runs
``serve_http`` owns the job queue and the guard's GPU workers; the HTTP workers only read
the workspace and put submissions in the queue (the database), then wait for the verdict
there. With ``workers=1`` the same process does both.

With several HTTP workers this process accepts the connections and hands each to the worker
that holds the fewest: ``workers.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket

from .app import ENV, FACTORY, build_app
from .sockets import uvicorn_speedups


def serve_http(service, options: dict, workers: int) -> str:
    """Serve until interrupted (SIGINT or SIGTERM); ``service`` is the evaluating one (this
    process). With ``workers`` > 1 this process serves no HTTP itself: it accepts the
    connections and hands each to the HTTP worker that holds the fewest. Returns what stopped
    it (a signal's name), for the reason its unfinished jobs give."""
    import uvicorn

    # ws="none": MCP needs no websockets, and an upgraded connection would escape the
    # dispatcher's count of each worker's connections
    common = dict(
        host=options["host"],
        port=options["port"],
        log_level="warning",
        access_log=False,
        ws="none",
        **uvicorn_speedups(),
    )
    if workers <= 1:
        # uvicorn shuts down gracefully on SIGTERM, then raises the signal again: as an exit,
        # so that the caller still closes the service (its guard workers, its job threads)
        signal.signal(signal.SIGTERM, _exit_quietly)
        try:
            uvicorn.run(build_app(service, options), **common)
        except _Terminated:
            return "SIGTERM"
        return "shut down"  # SIGINT, where it is ignored (SIGINT otherwise raises KeyboardInterrupt)
    os.environ[ENV] = json.dumps(options)
    if not (hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX")):
        # no descriptor passing (Windows): one socket shared by uvicorn's workers
        uvicorn.run(FACTORY, factory=True, workers=workers, **common)
        return "shut down"
    from .workers import Workers  # imports uvicorn's internals: only when asked for

    workers_ = Workers(options["host"], options["port"], workers, common)
    workers_.run()
    return workers_.stopped_by


class _Terminated(SystemExit):
    """SIGTERM, raised once uvicorn has shut down gracefully."""


def _exit_quietly(*_) -> None:
    raise _Terminated(0)
