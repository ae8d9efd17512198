"""Shared fixtures; the helpers they use are in ``helpers.py``. Everything runs on the CPU:
PyTorch CPU, Triton's interpreter, the CPU-sized workloads of each problem. Caches and locks go
to a per-session temp folder."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="kernelarc-tests-"))
os.environ["KERNELARC_CACHE_DIR"] = str(_SESSION_TMP / "cache")
os.environ["KERNELARC_LOCK_DIR"] = str(_SESSION_TMP / "locks")
os.environ.pop("KERNELARC_WORKSPACE", None)
if not Path("/dev/nvidiactl").exists():
    # Triton kernels run in this process too (kernelarc verify); its interpreter must be
    # chosen before triton is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers import SOL_EXAMPLES, make_guard  # noqa: E402  (after the environment above)


@pytest.fixture(scope="session")
def session_tmp() -> Path:
    return _SESSION_TMP


@pytest.fixture(scope="session")
def guard(session_tmp):
    """A guard with every gate on (static screen included)."""
    g = make_guard(session_tmp / "ws-screen", call_timeout_s=10)
    g.store.import_path(SOL_EXAMPLES / "softmax_h4096")
    yield g
    g.close()


@pytest.fixture(scope="session")
def guard_runtime_only(session_tmp):
    """The static screen off: shows that the run-time defences hold on their own."""
    g = make_guard(session_tmp / "ws-runtime", static_screen=False, call_timeout_s=10)
    g.store.import_path(SOL_EXAMPLES / "softmax_h4096")
    yield g
    g.close()
