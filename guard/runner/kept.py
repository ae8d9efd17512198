"""The outputs of a CPU's loops, held for the guard to read: the outside clock's loop's where
each call left them and, since session 48, the timed loop's as dense copies made right after
each call (``CandidateRole._run_held``).

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

The timed loop had digested each call in the candidate's process, with the digest's signs and
sampled positions there too: a candidate that walked its stack to them returned outputs 98%
wrong with every field of the digest exact, and was ACCEPTed (red team, session 47). Its calls'
outputs are now held too (copies: ``take``) and read by the guard after the loop, with the
worker stopped: nothing the check depends on is in the candidate's process.
"""

from __future__ import annotations

from typing import Any

import torch

from . import messages as m
from .common import dtype_name
from .harness import T


def describe(t: Any) -> m.HeldOutput | None:
    """Where a CPU tensor lies, for the guard to read it (None: not a CPU tensor)."""
    if T.type(t) is not T.tensor_type or t.device.type != "cpu":
        return None
    return m.HeldOutput(address=T.data_ptr(t), shape=list(t.shape), stride=list(t.stride()), dtype=dtype_name(t))


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

    def take(self, it: int, got: list[Any] | None, copy: bool = False) -> None:
        """Hold iteration ``it``'s outputs: those returned, or its own destination buffers.

        ``copy`` (the timed loop, whose calls are timed one at a time, so copies made between
        them are no call's cost): each output held as a dense copy made right after its call, so
        that what the guard reads is what the call returned, whatever becomes of the memory it
        returned: a view of an input that the next refill changes, a slice of a wider buffer
        that the guard does not read whole (red team, session 48: an honest kernel of the
        latter kind was REWARD_HACK). Without it (an outside clock's window, where a copy would
        be the candidate's cost, and one it could skip) the outputs are held as they lie: a
        kernel that returns one call's memory again for a later call is refused before any
        timing (``CandidateRole.check``), and one that points a call at an earlier answer
        fails the read."""
        if got is None:
            if self.static is None:
                raise RuntimeError("a call without outputs in a loop without destinations")
            got = self._own[it]
        self.held.append([T.clone(t) if copy and T.type(t) is T.tensor_type else t for t in got])

    def described(self) -> list[list[m.HeldOutput | None]]:
        """Per iteration held, where each of its outputs lies."""
        return [[describe(t) for t in row] for row in self.held]

    def finish(self) -> None:
        """The destination lists as they were, for the timed loop and the checks."""
        for outs, orig in zip(self.static or [], self._restore):
            outs[:] = orig
