"""Worker-side helpers shared by both roles."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .harness import T


class CandidateFault(Exception):
    """A verdict-worthy failure of the candidate: ``status`` and an actionable message."""

    def __init__(self, status: str, message: str, fatal: bool = False):
        super().__init__(message)
        self.status = status
        self.message = message
        self.fatal = fatal  # the worker's CUDA context may be broken: do not reuse it


def load_module_from_source(source: str, folder: Path, stem: str) -> ModuleType:
    """Import ``source`` from a real file (Triton's decorators read their source back)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    name = f"{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no loader for {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def is_torch_result_tuple(kind: type) -> bool:
    """torch's own named result tuples (torch.max's and kin): C types, no candidate code."""
    return getattr(kind, "__module__", "") == "torch.return_types"


def plain_container(value: object) -> bool:
    """A dict, tuple or list itself, or one of torch's own result tuples."""
    kind = T.type(value)
    return kind in (dict, tuple, list) or is_torch_result_tuple(kind)


def normalize_outputs(result: Any, output_names: list[str]) -> list[Any]:
    """The candidate's (or reference's) return value as a list in definition order."""
    n = len(output_names)
    if T.isinstance(result, (dict, tuple, list)) and not plain_container(result):
        # a subclass would run the candidate's own code wherever the guard reads it
        raise CandidateFault(
            "REWARD_HACK",
            f"returned a {T.type(result).__name__}, a subclass of a container: return a plain tuple, list or dict",
        )
    if T.isinstance(result, dict):
        missing = [k for k in output_names if k not in result]
        if missing:
            raise CandidateFault("INCORRECT_SHAPE", f"returned a dict without {missing}")
        return [result[k] for k in output_names]
    if T.isinstance(result, (tuple, list)):
        if T.len(result) != n:
            raise CandidateFault(
                "INCORRECT_SHAPE",
                f"returned {T.len(result)} values; expected {n} ({', '.join(output_names)})",
            )
        return list(result)
    if n == 1:
        return [result]
    raise CandidateFault("INCORRECT_SHAPE", f"returned one value; expected {n} ({', '.join(output_names)})")


def storage_range(t: torch.Tensor) -> tuple[int, int]:
    st = T.untyped_storage(t)
    start = st.data_ptr()
    return start, start + st.nbytes()


def flat(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements in one dimension (a copy only when ``t`` is not contiguous)."""
    out: torch.Tensor = T.view(T.contiguous(t), (-1,))
    return out


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A one-byte view of ``t``'s storage, whatever its dtype (NaNs and signed zeros as they lie)."""
    raw: torch.Tensor = t if t.dtype == torch.uint8 else T.view(t, torch.uint8)
    return raw


def dtype_name(t: torch.Tensor) -> str:
    """``bfloat16`` for ``torch.bfloat16``: the name the definitions and messages use."""
    return str(t.dtype).replace("torch.", "")


class PeakMeter:
    """A worker's peak memory request by request: on a GPU what torch's allocator reserved, on
    the CPU the resident set's high-water mark. Each request starts from the memory held when
    it begins; the ``memory`` request reads the peak of each request kind since the last reset
    (where a verdict's memory went) and the largest of them."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.by_op: dict[str, int] = {}

    def before(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            clear_high_water()

    def after(self, op: str) -> None:
        peak = int(torch.cuda.max_memory_reserved()) if self.cuda else high_water_bytes()
        self.by_op[op] = max(self.by_op.get(op, 0), peak)

    def read(self, reset: bool) -> tuple[int, dict[str, int]]:
        """(peak, peak per request kind) since the last reset. A reset first lets go of what
        is cached but unused, so that the next peak counts what the next work holds, not what
        earlier work left in the allocator's cache."""
        by_op = dict(self.by_op)
        now = int(torch.cuda.max_memory_reserved()) if self.cuda else high_water_bytes()
        peak = max([now, *by_op.values()])  # what is held now counts even when no request ran
        if reset:
            self.by_op.clear()
            if self.cuda:
                release_device_cache()
            else:
                trim_host_heap()
            self.before()
        return peak, by_op


def release_device_cache() -> None:
    """Give the caching allocator's unused blocks back to the driver, cuBLAS's workspaces
    first: a workspace (32 MiB a stream on Hopper) is allocated by the first matmul inside
    whatever block is free then, and a 1 GiB segment freed just before (the ceilings' copy
    buffer, a large round's outputs) stayed reserved for the worker's life around it."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


def high_water_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def clear_high_water() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
    except OSError:
        pass


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, for the heap's controls; None where the C library is another (nothing to tune)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 - both must exist
    except (OSError, AttributeError):
        return None
    return libc


def trim_host_heap() -> None:
    """Give the C heap's free memory back to the system (glibc's ``malloc_trim``). Blocks under
    its mmap threshold (32 MiB at most) stay in the heap when freed and would count in the
    resident set, the CPU's peak-memory figure, long after the tensors that used them are gone."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def prefault_host_heap(nbytes: int) -> None:
    """Make ``nbytes`` of the C heap resident and keep it so: every block from the heap (none
    mapped apart), nothing given back when freed (until ``trim_host_heap``), and one block of
    that size written and freed. Blocks allocated afterwards then reuse pages already touched:
    a loop that holds each call's outputs (``kept``) would otherwise pay a page fault per page
    of every output, which the same call timed on reused memory does not. Not glibc: nothing."""
    libc = _glibc()
    if libc is None:
        return
    libc.mallopt(_M_MMAP_MAX, 0)
    libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)  # an int: the largest
    if nbytes > 0:
        block = T.zeros(nbytes, dtype=torch.uint8)
        del block
