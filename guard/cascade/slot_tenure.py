"""An evaluation's tenure of the timing slot: a candidate's processes run only while its guard
holds the slot.

The slot (``runner/slot.py``) keeps timing from overlapping other guard work on the device,
but a candidate's process tree lives from its build to the end of its evaluation, and used
to run outside any hold: during its build, and between gates while its guard waited for the
slot. A red team's candidate (session 40, CPU, two guards on one machine as a
``kernelarc submit`` beside a server makes) forked 600 spinners in its build, each in a
session of its own, while another guard timed an honest kernel: that kernel's evaluation took
8-18x longer and its recorded figures 1.3-2.5x, with the attacker PASSED. So:

- the build and the correctness rounds run under a shared hold, taken before the candidate's
  code first runs (no timing of another guard overlaps them);
- to time, the shared hold must be let go before the exclusive one is taken (flock cannot
  change one into the other without letting go); meanwhile the candidate's tree is stopped
  (``candidate_stopped``), and a tree that ran while stopped is REWARD_HACK, killed at its
  first wake-up (``runner/tree_watch.py``: its own timers once continued it through another
  guard's timing, red team session 41);
- the exclusive hold lasts to the evaluation's end (benchmark, pairing, held-out rounds), and
  the candidate's worker is discarded before it is let go.

What is left: slots are per device, so on a host of several GPUs (or a guard judging on the
CPU beside one on a GPU) a candidate judged on one device still shares the host's CPUs with
the timing on another; and a slow build keeps other guards' timing waiting, up to
``build_timeout_s`` (docs/guard.md, "Processes").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import TracebackType

from ..runner.process import WorkerProcess
from .context import Progress
from .reference_side import ReferenceSide
from .workload_requests import candidate_stopped


class SlotTenure:
    """Used as ``with SlotTenure(ref, progress) as tenure:`` around everything a candidate's
    worker does in an evaluation: ``share()`` before its code first runs, ``to_exclusive``
    before the benchmark."""

    def __init__(self, ref: ReferenceSide, progress: Progress):
        self.ref, self.progress = ref, progress
        self._hold = contextlib.ExitStack()
        self.waited_s = 0.0  # for the slot, in all (the verdict's phase "slot")
        self.settled_s = 0.0  # in ``to_exclusive``'s ``settle``, holding nothing

    def __enter__(self) -> "SlotTenure":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._hold.close()

    def share(self) -> None:
        """The shared hold, for the build and the correctness rounds."""
        if self.ref.slot.held() is None:
            self.waited_s += self._hold.enter_context(self.ref.hold(False, self.progress))

    def to_exclusive(self, cand: WorkerProcess, settle: Callable[[], float | None] | None = None) -> None:
        """The exclusive hold, for the rest of the evaluation; ``cand``'s tree stopped while
        neither is held. ``settle`` runs there, holding nothing (the pool's wait for its
        spares' starts, ``WorkerPool.quiet_spare``): a start that hangs then keeps no other
        guard's timing waiting, as it did for up to 180 s when the wait came after the hold was
        taken. Its seconds are added to ``settled_s``."""
        if self.ref.slot.held() == "exclusive":
            return
        with candidate_stopped(cand, None, "while its guard waited for the timing slot"):
            self._hold.close()
            if settle is not None:
                self.settled_s += settle() or 0.0
            self.waited_s += self._hold.enter_context(self.ref.hold(True, self.progress))
