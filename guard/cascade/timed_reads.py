"""The guard's read of a CPU timed loop's checked calls (``RunReply.held``).

The timed loop had digested each call in the candidate's process, and the digest's signs and
sampled positions lived there too: a candidate that walked its stack to them returned outputs
98% wrong with every field exact, and was ACCEPTed (red team, session 47). A CPU's timed loop
now holds every call's outputs (``runner/kept.py``). After the loop,
with the candidate's whole tree stopped, the guard reads the calls it chose in secret out of the
worker's memory (``runner/peek.py``) into files that the trusted worker compares with the
reference element by element, as the outside clock's windows already were. The candidate's
process learns which calls were chosen only by being accused. Since session 48's red team the
loop holds a dense copy of each call's outputs, made right after it, not the memory it returned.
"""

from __future__ import annotations

from pathlib import Path

from ..runner import messages as m
from ..runner.peek import PeekError
from . import held_outputs, staged_inputs
from .reasons import GuardError
from .workload_requests import WorkloadContext, candidate_stopped


def read_chosen(cx: WorkloadContext, ran: m.RunReply, chosen: list[int], dest: Path) -> list[list[m.ReadOutput | None]]:
    """Per chosen call, its outputs as the guard read them into ``dest``, the candidate's tree
    stopped meanwhile (a thread of its that ran on after the reply cannot change them under the
    read). Where the reply says they lie is the candidate's word: a place that does not hold a
    tensor of the definition's shape and dtype, densely enough to be read whole (the loop
    holds dense copies), or cannot be read, is REWARD_HACK. A kernel that will not let the
    guard read the worker's memory at all is the guard's limit, not the candidate's doing."""
    expected = held_outputs.expected_outputs(cx.d, cx.w)
    dest.mkdir(parents=True, exist_ok=True)
    with candidate_stopped(cx.worker, cx.w, "while the guard read the outputs of its timed calls"):
        try:
            pid = staged_inputs.worker_process(cx.worker)
            return [
                held_outputs.read_or_accuse(
                    pid, ran.held[i], expected, dest, f"call{i}", cx.w, "its timed calls", False
                )
                for i in chosen
            ]
        except PeekError as exc:  # the worker's process gone from its tree
            raise held_outputs.accused(cx.w, "its timed calls", exc) from None
        except OSError as exc:
            raise GuardError(f"reading the timed calls of {cx.w.uuid}: {exc}") from None
