"""The outputs of the outside clock's loop on a CPU, held where each call left them.

On a GPU the loop digests every call's outputs in captured graphs and the short-loop check
bounds what a candidate gains by doing that work more cheaply. A CPU has neither: digests and
copies done in the candidate's process were its own to skip, and a red team (session 18) that
replaced the loop with one that digested in float32 and copied nothing made its outside
figure near zero. So on a CPU the loop does no work of its own: each call's outputs stay where
the call put them (an eager call's own tensors; for destination passing, a fresh set of
buffers per call, made before the loop), and the guard reads the ones it chose out of the
worker's memory itself as soon as the call says it is done (``runner/pacing.py``,
``runner/peek.py``). What the candidate's process says about them is only where to look:
memory that does not hold the answer for that call's inputs fails the check as a skipped call
does.
"""

from __future__ import annotations

from typing import Any

import torch

from .harness import T


class KeptOutputs:
    """Per iteration of a loop, its call's output tensors, kept alive until the next loop.
    ``static``: per set, the destination list the call writes into (destination passing: its
    contents are swapped for the iteration's own buffers before each call), or None."""

    def __init__(self, static: list[list[torch.Tensor]] | None, rows: int):
        self.static = static
        self.rows = max(1, rows)
        self.held: list[list[Any]] = []
        self._own: list[list[torch.Tensor]] = []  # destination passing: a buffer set per row
        self._restore: list[list[torch.Tensor]] = []
        if static is not None:
            self._restore = [list(outs) for outs in static]
            n = len(static)
            # written once here, so the pages are the process's before any window
            self._own = [[T.zero_(T.clone(t)) for t in static[r % n]] for r in range(self.rows)]

    def reset(self) -> None:
        """Let the last loop's outputs go."""
        self.held = []

    def before(self, it: int, k: int) -> None:
        """Destination passing: set ``k``'s destinations are iteration ``it``'s own buffers."""
        if self.static is not None:
            self.static[k][:] = self._own[it]

    def take(self, it: int, got: list[Any] | None) -> None:
        """Hold iteration ``it``'s outputs: those returned, or its own destination buffers."""
        if got is None:
            if self.static is None:
                raise RuntimeError("a call without outputs in a loop without destinations")
            got = self._own[it]
        self.held.append(list(got))

    def finish(self) -> None:
        """The destination lists as they were, for the timed loop and the checks."""
        for outs, orig in zip(self.static or [], self._restore):
            outs[:] = orig
