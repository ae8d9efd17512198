"""A probe's failures in words, and the limits a probed file runs under."""

from __future__ import annotations

import contextlib
import os
import signal
import traceback
from collections.abc import Iterator


class ProbeTimeout(BaseException):
    """Raised by the interval timer; a BaseException so that user code's ``except Exception``
    cannot swallow it."""


class ProbeFailure(Exception):
    def __init__(self, phase: str, reason: str, exc: BaseException | None = None):
        super().__init__(f"{phase}: {reason}")
        self.phase = phase
        self.reason = reason
        self.exc = exc


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def _fire(signum: int, frame: object) -> None:
        raise ProbeTimeout()

    old = signal.signal(signal.SIGALRM, _fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def where_in_file(exc: BaseException, path: str) -> str:
    """The deepest line of the problem file in the exception's traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if not frames:
        return ""
    f = frames[-1]
    code = (f.line or "").strip()
    return f"line {f.lineno} in {f.name}" + (f": `{code}`" if code else "")


def meta_limitation(exc: BaseException, where: str) -> str:
    """What the meta device could not do, in words."""
    msg = str(exc)
    code = where.split("`")[1] if "`" in where else ""
    if "item() cannot be called on meta" in msg or "_local_scalar_dense" in msg:
        if code.startswith(("if ", "while ", "elif ", "assert ")):
            return "branches on a tensor's value, which the meta device cannot evaluate"
        return "calls .item() on a tensor (reads a value), which the meta device cannot evaluate"
    if "data-dependent" in msg.lower() or "nonzero" in msg:
        return "has an output shape that depends on tensor values, which the meta device cannot evaluate"
    if "meta" in msg.lower() and ("Could not run" in msg or isinstance(exc, NotImplementedError)):
        op = msg.split("'")[1] if "'" in msg else "an operator"
        return f"uses {op}, which has no meta kernel"
    return "fails on the meta device"


def failure_reason(exc: BaseException, path: str, limit: float | None = None) -> str:
    where = where_in_file(exc, path)
    if isinstance(exc, ProbeTimeout):
        text = f"took over {limit:g} s" if limit else "ran out of time"
    elif isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) or ("DefaultCPUAllocator" in str(exc)):
        text = f"ran out of memory (the probe allows {memory_cap_gib():g} GiB)"
    else:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "(no message)"
        text = f"{type(exc).__name__}: {first[:300]}"
    return f"{where}: {text}" if where else text


def memory_cap_gib() -> float:
    return float(os.environ.get("KERNELARC_PROBE_MEM_GIB", "4"))
