"""How much memory a problem's evaluation needs, checked before any work, and how much its
workers used at their peak (reported in the verdict).

The need of one workload is estimated from the definition alone: the candidate's worker
holds its live input sets (1 to 4), one round's outputs and the flush buffer; the trusted
worker holds one round's inputs, the reference's outputs and the candidate's outputs read
back, and compares them a chunk at a time. A problem whose largest workload needs more than
the device has is refused with the figures before any worker is asked to do anything, never
left to end in an out-of-memory error in the middle of a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from ..problems.dtypes import dtype_info
from ..problems.schema import Definition, TensorSpec, Workload

# what torch, CUDA's context and the worker's own code take besides the tensors
RUNTIME_RESERVE_BYTES = {"cuda": 2 << 30, "cpu": 3 << 30}


def tensor_bytes(d: Definition, w: Workload) -> tuple[int, int]:
    """(input bytes, output bytes) of one call on workload ``w``."""
    axes = d.resolve_axes(w.axes)

    def total(specs: Iterable[TensorSpec]) -> int:  # whole bytes: a sub-byte tensor's rounded up
        return math.ceil(
            sum(dtype_info(s.dtype).bytes * math.prod(d.shape_of(s, axes)) for s in specs if s.shape is not None)
        )

    return total(d.inputs.values()), total(d.outputs.values())


# a timed loop's input set (inputs and outputs of one call) below the first size rotates over 4
# sets, below the second over 2, above it uses 1. From 256 MiB (twice the largest L2 of a GPU
# today, and the flush runs between a set's refill and its call anyway) another set only adds
# memory: at 1 GiB, KernelBench's sub-GiB convolutions held 4-6x a call's own memory on the H200.
SMALL_SET_BYTES = 64 << 20
LARGE_SET_BYTES = 256 << 20


def input_sets(set_bytes: int, kind: str) -> int:
    """How many input sets a timed loop rotates over. Each set is held with its own outputs (a
    captured graph per set); every timed call gets fresh values in its set anyway, and a set
    this large cannot stay in any cache between its turns: more sets would only multiply the
    memory a verdict holds. The CPU rotates over 2 at most."""
    n = 4 if set_bytes < SMALL_SET_BYTES else 2 if set_bytes < LARGE_SET_BYTES else 1
    return min(n, 2) if kind == "cpu" else n


def workload_need(d: Definition, w: Workload, n_sets: int, flush_bytes: int) -> int:
    """Bytes the busier of the two workers needs for ``w`` at its peak."""
    inputs, outputs = tensor_bytes(d, w)
    candidate = n_sets * inputs + 2 * outputs + flush_bytes
    trusted = inputs + 3 * outputs  # reference outputs, the candidate's read back, a float64 chunk's worth
    return max(candidate, trusted)


def does_not_fit(
    d: Definition,
    workloads: list[Workload],
    capacity_bytes: int | None,
    kind: str,
    n_sets_of: Callable[[Workload], int],
    flush_bytes: int,
) -> str | None:
    """Why the problem cannot be evaluated on a device of ``capacity_bytes``, or None."""
    if not capacity_bytes:
        return None
    usable = capacity_bytes - RUNTIME_RESERVE_BYTES.get(kind, 0)
    worst = max(workloads, key=lambda w: workload_need(d, w, n_sets_of(w), flush_bytes), default=None)
    if worst is None:
        return None
    need = workload_need(d, worst, n_sets_of(worst), flush_bytes)
    if need <= usable:
        return None
    inputs, outputs = tensor_bytes(d, worst)
    return (
        f"problem {d.name} does not fit this {kind} device: workload {worst.uuid} needs about "
        f"{_gb(need)} (inputs {_gb(inputs)} per call, outputs {_gb(outputs)}, {n_sets_of(worst)} input sets "
        f"rotated while timing), and the device has {_gb(capacity_bytes)} of which about {_gb(usable)} are "
        f"usable; use smaller workloads (or a device with more memory)"
    )


def _gb(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= (1 << 30) else f"{n / (1 << 20):.0f} MiB"


class PeakWatch:
    """Both workers' peak memory gate by gate: each reading resets the worker's high-water
    marks, so a verdict says which gate's work held the most (``by_gate``: per gate, each
    worker's peak and, as ``"worker.request"``, the peak of each kind of request it served
    there) besides each worker's peak over the whole evaluation (``overall``)."""

    def __init__(self, read: Callable[[str, bool], tuple[int, dict[str, int]] | None]) -> None:
        self._read = read  # (worker role, reset) -> (peak, per request kind), None when it cannot answer
        self.by_gate: dict[str, dict[str, int]] = {}

    def start(self, *roles: str) -> None:
        """Forget what these workers held before this evaluation (baselines, earlier problems)."""
        for role in roles:
            self._read(role, True)

    def mark(self, gate: str, *roles: str) -> None:
        """The peak of each worker (and of each of its requests) since its last reading, as ``gate``'s."""
        for role in roles:
            got = self._read(role, True)
            if got is None:
                continue
            peak, by_op = got
            mine = self.by_gate.setdefault(gate, {})
            for key, value in [(role, peak)] + [(f"{role}.{op}", b) for op, b in by_op.items()]:
                mine[key] = max(mine.get(key, 0), value)

    def overall(self) -> dict[str, int] | None:
        out: dict[str, int] = {}
        for peaks in self.by_gate.values():
            for key, peak in peaks.items():
                if "." not in key:
                    out[key] = max(out.get(key, 0), peak)
        return out or None
