"""Shared fixtures; the helpers they use are in ``helpers.py``. Everything runs on the CPU:
PyTorch CPU, Triton's interpreter, the CPU-sized workloads of each problem. Caches go to a
per-process temp folder, the timing slot's locks to one folder per run. The suite runs in
xdist workers (pyproject's addopts), long tests first; ``-n 0`` runs it in one process."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="kernelarc-tests-"))
os.environ["KERNELARC_CACHE_DIR"] = str(_SESSION_TMP / "cache")
os.environ["KERNELARC_LOCK_DIR"] = str(_SESSION_TMP / "locks")  # this process's: _shared_timing_slot
os.environ.pop("KERNELARC_WORKSPACE", None)
if not Path("/dev/nvidiactl").exists():
    # Triton kernels run in this process too (kernelarc verify); its interpreter must be
    # chosen before triton is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers import SOL_EXAMPLES, MadeHere, in_shard, make_guard  # noqa: E402  (after the environment above)


def _gpu_run(config) -> bool:
    """Whether this run selects the GPU tests (``-m gpu``)."""
    markexpr = config.getoption("markexpr") or ""
    return "gpu" in markexpr.replace("not gpu", "")


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto`` (pyproject's addopts): two workers on the project's 2-core machines, up to
    four on larger ones; none for the GPU tests (``-m gpu``), which time kernels on one device."""
    if _gpu_run(config):
        return 0
    return max(2, min(4, os.cpu_count() or 2))


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--shard",
        default=None,
        metavar="K/N",
        help="run only part K of N of the selected tests (each test's part from a hash of its id, "
        "the same in every run): a GPU run longer than one device call is split over N calls",
    )
    parser.addoption(
        "--gpu-workloads",
        type=int,
        default=None,
        metavar="N",
        help="GPU tests: judge the cheats' RMSNorm problem on N of its workloads (the smallest, the "
        "largest and evenly between), so that more cheats fit in one device call; all by default",
    )


def _shard(config) -> tuple[int, int] | None:
    """``--shard K/N`` as (K, N), 1 <= K <= N; a clear error for anything else."""
    text = config.getoption("shard")
    if text is None:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes K/N, two whole numbers, not {text!r}") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard {text}: K must be between 1 and N")
    return k, n


def pytest_collection_modifyitems(config, items) -> None:
    """With ``--shard K/N``, only that part of the tests. Then the modules with a test marked
    ``slow`` first, and those tests first within their module: with several workers, the long
    tests start at once instead of running alone at the end. A module's tests stay together and
    in order, so that a run in one process still makes each module's fixtures once."""
    shard = _shard(config)
    if shard is not None:
        kept = [item for item in items if in_shard(item.nodeid, *shard)]
        deselected = [item for item in items if not in_shard(item.nodeid, *shard)]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = kept
    modules: dict[str, int] = {}
    heavy: set[str] = set()
    for item in items:
        path = item.nodeid.split("::")[0]
        modules.setdefault(path, len(modules))
        if item.get_closest_marker("slow"):
            heavy.add(path)

    def key(item) -> tuple[bool, int, bool]:
        path = item.nodeid.split("::")[0]
        return (path not in heavy, modules[path], item.get_closest_marker("slow") is None)

    items.sort(key=key)


def pytest_runtest_logreport(report) -> None:
    """With ``KERNELARC_TEST_LOG`` set, each test's outcome is appended to that file as it
    ends: a device call cut off by its time limit (pytest's own summary and junit file come
    only at the end) still brings back what ran, failures with their first lines."""
    path = os.environ.get("KERNELARC_TEST_LOG")
    if not path or (report.when != "call" and report.passed):
        return
    line = f"{report.outcome.upper()} {report.nodeid} ({report.when}, {report.duration:.1f} s)\n"
    if report.failed:
        text = str(report.longrepr)
        line += "".join(f"    {ln}\n" for ln in text.splitlines()[-12:])
    with open(path, "a") as log:
        log.write(line)


def pytest_unconfigure(config) -> None:
    """Remove this process's temp folder (caches, workspaces) once its fixtures are closed: a
    run left about 6 MB in /tmp per process, and every run made new ones."""
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _shared_timing_slot(request, tmp_path_factory):
    """Under xdist, the workers of a GPU run (``-m gpu -n 3``) share one lock folder (in the
    run's own temp folder, which pytest cleans up), so that their guards take turns timing the
    one device, as guards in several processes of one machine do.

    The workers of a CPU run keep a folder each (this process's, set above). Shared, one
    worker's correctness checks waited for the slot while the other's guard timed on one core:
    in a 614 s run the tests waited 187 s for it and the CPU was 18% idle (session 36). Now
    they run beside the other's timing, as a busy machine's other work does, which every CPU
    test is written to bear (the suite passes beside a CPU hog). The slot's own behaviour is
    tested in test_slot.py, with guards that share a folder on purpose."""
    if hasattr(request.config, "workerinput") and _gpu_run(request.config):
        locks = tmp_path_factory.getbasetemp().parent / "locks"
        locks.mkdir(exist_ok=True)
        os.environ["KERNELARC_LOCK_DIR"] = str(locks)


@pytest.fixture(scope="session")
def session_tmp() -> Path:
    return _SESSION_TMP


# The shared guards judge the cheats and the honest candidate after each fault. With the CPU's
# pairing band (2.5x) every honest verdict after the first was re-measured side by side with the
# global best, 15-25 s each, for a decision no test of theirs reads; a band this narrow makes
# every stored comparison clear-cut. Pairings, and cheats against them, are tested in
# test_pairing.py and test_redteam_pairing.py.
CLEAR_CUT_BAND = 1.000001


@pytest.fixture(scope="session")
def guard(session_tmp):
    """A guard with every gate on (static screen included)."""
    g = make_guard(session_tmp / "ws-screen", call_timeout_s=10, pairing_band_cpu=CLEAR_CUT_BAND)
    g.store.import_path(SOL_EXAMPLES / "softmax_h4096")
    yield g
    g.close()


@pytest.fixture(scope="session")
def guard_runtime_only(session_tmp):
    """The static screen off: shows that the run-time defences hold on their own."""
    g = make_guard(session_tmp / "ws-runtime", static_screen=False, call_timeout_s=10, pairing_band_cpu=CLEAR_CUT_BAND)
    g.store.import_path(SOL_EXAMPLES / "softmax_h4096")
    yield g
    g.close()


@pytest.fixture
def needs_bwrap():
    """The OS sandbox's probe result; skips where bwrap cannot run here, except under CI, where
    the sandbox must work and the test fails instead."""
    from guard import sandbox

    iso = sandbox.probe()
    if not iso.available:
        if os.environ.get("CI"):
            pytest.fail(f"the sandbox must work in CI: {iso.line()}")
        pytest.skip(iso.line())
    return iso


@pytest.fixture
def made_here(monkeypatch) -> MadeHere:
    made = MadeHere()
    real_pipe, real_open, real_pair = os.pipe, os.open, socket.socketpair

    def pipe() -> tuple[int, int]:
        fds = real_pipe()
        made.record(*fds)
        return fds

    def open_(*args, **kwargs) -> int:
        fd = real_open(*args, **kwargs)
        made.record(fd)
        return fd

    def socketpair(*args, **kwargs):
        pair = real_pair(*args, **kwargs)
        made.record(*(s.fileno() for s in pair))
        return pair

    monkeypatch.setattr(os, "pipe", pipe)
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(socket, "socketpair", socketpair)
    return made
