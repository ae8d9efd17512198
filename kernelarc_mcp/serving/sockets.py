"""The listening side of the HTTP server: whether a port is free, which address family a
host needs, and which event loop and HTTP parser uvicorn gets."""

from __future__ import annotations

import importlib.util
import socket

STARTUP_FAILURE = 3  # uvicorn's exit status when a server cannot start


def uvicorn_speedups() -> dict:
    fast = importlib.util.find_spec("uvloop") and importlib.util.find_spec("httptools")
    return {"loop": "uvloop" if fast else "asyncio", "http": "httptools" if fast else "h11"}


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
