"""Fixtures for the MCP server tests: a service on the CPU with the fast guard settings."""

from __future__ import annotations

import pytest

from helpers import make_service


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = make_service(tmp_path_factory.mktemp("mcp") / "ws")
    yield svc
    svc.close()
