"""Fixtures for the MCP server tests: a service on the CPU with the fast guard settings."""

from __future__ import annotations

import pytest

from conftest import fast_config  # noqa: F401


@pytest.fixture
def anyio_backend():
    return "asyncio"


def make_service(path, **overrides):
    from guard.workspace import Workspace
    from kernelarc_mcp.service import Service

    ws = Workspace.open(path)
    return Service(ws, fast_config(correctness_rounds=1, **overrides), device="cpu")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = make_service(tmp_path_factory.mktemp("mcp") / "ws")
    yield svc
    svc.close()
