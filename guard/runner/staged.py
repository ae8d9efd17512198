"""The inputs of a CPU's outside-clock loop, one set per call, written by the guard.

On a CPU the loop's windows were once the draws and the calls: each call's inputs drawn in
the candidate's worker, the same draws timed in the trusted worker and subtracted. The draws
cost three to six times a small call (a generator's normal draws, 4 ns an element), and a
stall or a busy neighbour lengthened the trusted worker's CPU time by a tenth to two thirds:
the outside figure, a small difference of two large ones, came out short by as much as the
call itself, and a median forged 100x short was decided at a tenth of the honest figure (a
loaded CI run, session 34). So the draws left the window: the trusted worker draws every
call's inputs (``runner.confirm.ConfirmLoop.inputs_at``, the same draws its checks make again
later) and names buffers of its own for them, and the guard writes them into both workers'
buffers, one set per call (``runner.poke``): call 0's before the window, while the candidate's
processes are stopped, and each next call's once the call before it is done
(``runner.pacing``), so that no call's inputs exist before the one before it has been
computed.

The candidate's process sees call 0's inputs only once it is running again, by which time
the guard's clock has started (its CPU time is counted from before it was continued).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from . import messages as m
from .common import dtype_name
from .harness import T
from .kept import describe


def _is_cpu_tensor(a: Any) -> bool:
    return T.type(a) is T.tensor_type and a.device.type == "cpu"


class StagedInputs:
    """Per call of a loop over the live ``sets``, the arguments it is made on. ``own``: each
    tensor a buffer of its own (the candidate's worker, where the guard writes the inputs);
    else the live sets' own tensors (the trusted worker, whose loop only places them)."""

    def __init__(self, sets: list[list[Any]], own: bool):
        self.sets, self.own = sets, own
        self.rows: list[list[Any]] = []
        self._restore = [list(s) for s in sets]

    def ensure(self, iters: int) -> None:
        """Sets for the first ``iters`` calls: made once, kept for the next windows."""
        n = len(self._restore)
        while len(self.rows) < iters:
            base = self._restore[len(self.rows) % n]
            self.rows.append([self._copy(a) for a in base] if self.own else list(base))

    def _copy(self, a: Any) -> Any:
        if not _is_cpu_tensor(a):
            return a
        # contiguous, the layout the guard writes; zeroed so its pages are the process's now
        return T.zero_(T.clone(a, memory_format=torch.contiguous_format))

    def place(self, it: int, k: int) -> None:
        """Call ``it``'s arguments into live set ``k``, which the call reads."""
        self.sets[k][:] = self.rows[it]

    def finish(self) -> None:
        """The live sets as they were, for the timed loop and the checks."""
        for live, orig in zip(self.sets, self._restore):
            live[:] = orig

    def describe(self, iters: int) -> list[list[m.HeldOutput | None]]:
        """Where each call's tensors lie (None: an argument the guard does not write)."""
        self.ensure(iters)
        return [[describe(a) for a in row] for row in self.rows[:iters]]


def draw_to_file(calls: Iterable[tuple[int, list[Any]]], path: Path | str) -> list[list[m.DrawnTensor | None]]:
    """The trusted worker's side: each call's arguments (``ConfirmLoop.inputs_at``), their
    tensors' bytes one after another into the file at ``path``; where each one lies in it."""
    rows: list[list[m.DrawnTensor | None]] = []
    offset = 0
    with open(path, "wb") as out:
        for _, args in calls:
            row: list[m.DrawnTensor | None] = []
            for a in args:
                if not _is_cpu_tensor(a):
                    row.append(None)
                    continue
                raw = T.view(T.reshape(T.contiguous(a), (-1,)), torch.uint8)
                out.write(memoryview(raw.numpy()))
                nbytes = T.numel(raw)
                row.append(m.DrawnTensor(offset=offset, nbytes=nbytes, shape=list(a.shape), dtype=dtype_name(a)))
                offset += nbytes
            rows.append(row)
    return rows
