"""The outside clock: timing that the candidate's process cannot forge.

The candidate's figures (CUPTI spans, events, the host clock) are taken inside its own
process, where its code can reach and change anything. So the guard also times, with its own
clock in its own process, a request in which the candidate's worker runs a loop of calls on
fresh inputs (``runner/confirm.py``), and the same loop run by the trusted worker without the
call (padding, draws, digests). The difference per call is what the call cost, as a clock
outside the candidate's reach saw it:

    outside_ms = wall(candidate's loop) / n - wall(loop without the call) / n_loop

A candidate's median that this contradicts, beyond ``rel`` of itself plus ``abs_ms`` plus
``slack`` of the loop's own cost per call (the trusted loop's, in the same windows: a
slowed trusted loop would widen its own band, which is why the candidate's processes are
stopped, and checked to have stayed still, while it runs: ``runner/freeze.py``), is a forged figure:
REWARD_HACK. Within that band a forgery goes unseen, so the band bounds what tampering can
gain; ``docs/guard.md`` gives the measured bands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel


class OutsideClock(BaseModel):
    """What the guard's clock measured for one workload, and the verdict on agreement."""

    run_wall_s: float  # around the candidate worker's timed loop (request to reply)
    run_iters: int
    loop_wall_s: float  # around the trusted worker's loop without the call
    loop_iters: int
    outside_ms: float  # per call
    inside_ms: float  # what the candidate's process reported, per call (a median)
    rel_band: float
    abs_band_ms: float
    agrees: bool
    # the candidate's loop ran faster than the same loop without its call, beyond the band:
    # it skipped part of the loop's own work (the padding is in its process too)
    short_loop: bool = False
    loop: str = "captured"  # "captured": draws and digests are graphs, padded; "eager": host-bound
    pad_ms: float = 0.0
    windows: int = 1  # windows run on each side; more than the first only while contradicted
    # the trusted loops run: one a window, and one more where the candidate's own figure would
    # otherwise decide a floored figure (``run_windows``)
    loop_windows: int = 1
    # seconds waited for a starting worker before the last windows (None: no worker was starting,
    # or no windows were run again)
    quiet_wait_s: float | None = None
    # the host set the candidate's loop's pace (by its own process's account, more host time
    # per iteration than the capped padding covers): the outside figure then holds host time
    # the inside one does not, so it floors the decided figure instead of holding it to a band
    host_bound: bool = False
    # a CPU: CPU time the candidate's tree used beside its busiest thread in the window that
    # decided (other cores at once), charged to that window on top of its wall time
    parallel_s: float = 0.0
    # a CPU: the figure per call of a window whose calls were paced one at a time (each call's
    # inputs written once the call before it was done: ``runner/pacing.py``), and the share of
    # it that floors the decided figure beside ``outside_ms`` (``floor_ms``). A paced call runs
    # after a handshake, its caches cold: 1.3-2.2x an honest small call's median on a 2-core
    # machine, so only a share floors; batching a window's calls cannot shorten it.
    paced_ms: float | None = None
    paced_share: float = 0.0
    # the trusted loops whose shortest was subtracted from the paced window
    paced_loops: int = 0

    @property
    def floor_ms(self) -> float:
        """The least the decided figure may be where the outside figure floors it."""
        return max(self.outside_ms, self.paced_share * (self.paced_ms or 0.0))


def judge(
    run_wall_s: float,
    run_iters: int,
    loop_wall_s: float,
    loop_iters: int,
    inside_ms: float,
    rel_band: float,
    abs_band_ms: float,
    loop_slack: float,
    loop: str = "captured",
    pad_ms: float = 0.0,
    check_short: bool = True,
    host_bound: bool = False,
) -> OutsideClock:
    """The outside figure per call and whether the inside one is within the band of it. An
    outside figure above the inside one counts against a candidate; so does one below minus
    the band (``check_short``: on a GPU), which no call can cost: the candidate's loop skipped
    part of the loop's own work (padding, which a candidate could otherwise drop to hide its
    call's time behind it). On the CPU, whose loop has no padding, a busy machine can make
    the trusted window the longer one by more than the band.

    ``host_bound``: the two figures do not measure the same thing (an eager call whose launches
    take longer on the host than the padding lets the device run ahead: the outside figure
    holds that host time, a CUPTI span does not), so a gap is no evidence; the caller floors
    the decided figure by the outside one instead, and only a short loop is contradicted."""
    loop_ms = loop_wall_s / max(1, loop_iters) * 1e3
    outside = run_wall_s / max(1, run_iters) * 1e3 - loop_ms
    abs_band_ms = abs_band_ms + loop_slack * max(0.0, loop_ms)
    short_loop = check_short and outside < -abs_band_ms
    within = host_bound or outside <= inside_ms * (1.0 + rel_band) + abs_band_ms
    agrees = within and not short_loop
    return OutsideClock(
        run_wall_s=run_wall_s,
        run_iters=run_iters,
        loop_wall_s=loop_wall_s,
        loop_iters=loop_iters,
        outside_ms=outside,
        inside_ms=inside_ms,
        rel_band=rel_band,
        abs_band_ms=abs_band_ms,
        agrees=agrees,
        short_loop=short_loop,
        loop=loop,
        pad_ms=pad_ms,
        host_bound=host_bound,
    )


def another_window(clock: OutsideClock | None, done: int, first: int, most: int, floors: bool = False) -> bool:
    """Whether the outside clock runs one more window after ``done``: always up to ``first``,
    then, up to ``most``, only while the figure is contradicted. A pause only lengthens a window,
    so another can only shorten the shortest and clear an honest figure that a pause made look
    slow; a forged figure is contradicted in every window, so it gains nothing from more.
    ``floors`` (the CPU, and a host-bound GPU loop, where the outside figure becomes the
    verdict's when it is the larger): also while it is, since a pause in the trusted loop's window shortens the outside figure
    (once 6x on a loaded 2-core machine: a forged figure floored by it gained 10x on one
    workload), and only the shortest trusted window of several is free of it. Likewise while
    the outside figure is zero or less: no call costs that, the trusted window was stalled, and
    a floor of zero would let a forged median decide (a red team's forged 1 us medians stood
    so on 2 of 16 CPU workloads after a single window, session 19)."""
    if done >= most:
        return False
    if done < first or clock is None or not clock.agrees:
        return True
    return floors and (_floors(clock) or clock.outside_ms <= 0)


def run_windows(
    window: Callable[[], OutsideClock],
    first: int,
    most: int,
    floors: bool,
    quiet: Callable[[], float | None],
    loop_again: Callable[[], OutsideClock] | None = None,
    retry_floor: bool = False,
) -> OutsideClock:
    """Run windows (``window`` runs one more and judges all run so far) as ``another_window``
    says; then, if the figure is still contradicted, wait for ``quiet`` (a spare worker that
    starts beside the evaluation: imports and the CUDA driver's set-up, tens of ms in a window
    of 100 short calls) and run as many windows again. A forged figure stays contradicted in
    all of them; an honest one whose windows all fell in that start is cleared.

    ``loop_again`` (where the outside figure floors the decided one): runs the trusted loop
    once more, alone, and judges again. It runs once, when the candidate's own figure is about
    to decide (the outside one at or below it): a stall in the one trusted window, from other
    work on the machine, lowers the outside figure by as much, and a forged median below the
    call's true cost then decided (a 1 us forgery under a 50 us call, once in seven runs of the
    CPU suite beside another test worker). The shortest of two trusted loops is far less
    likely stalled; a longer outside figure then floors the forged one, and windows go on as
    ``another_window`` says. An honest figure costs one trusted loop more at most.

    ``retry_floor`` (a GPU loop the host paces): a floor that still stands after the windows is
    treated as a contradiction is, once: a quiet wait and as many windows again. There the
    outside figure is the difference of two host-bound walls, and a pause that lengthened both of
    the candidate's windows floored honest figures in about one workload in eight on the H100
    (session 47: 0.010 ms floored to 0.217 ms), each floor a false REVERT or a pairing. A true
    floor (a forged median, or host time that is the call's own) stands in every window: it costs
    the extra windows and loses nothing."""
    clock: OutsideClock | None = None
    done = 0
    quiet_s: float | None = None  # seconds waited for a starting worker (None: none was starting)
    retried = False
    looped_again = False
    while True:
        if another_window(clock, done, first, most, floors):
            clock = window()
            done += 1
            continue
        if loop_again is not None and not looped_again and _own_figure_decides(clock):
            clock = loop_again()
            looped_again = True
            continue
        if clock is None or retried or (clock.agrees and not (retry_floor and _floors(clock))):
            break
        quiet_s, retried = quiet(), True
        most = done + most
    assert clock is not None  # most >= 1: config fields are ge=1
    return clock.model_copy(update={"quiet_wait_s": quiet_s})


def _floors(clock: OutsideClock) -> bool:
    """Whether the outside figure is above the candidate's own: where it floors, it decides."""
    return clock.outside_ms > clock.inside_ms


def _own_figure_decides(clock: OutsideClock | None) -> bool:
    return clock is not None and clock.agrees and clock.outside_ms <= clock.inside_ms


def inside_figure_ms(stats: dict[str, Any]) -> float:
    """The candidate's own figure per call that the outside clock checks: the median that
    decides the verdict (CUPTI spans, events or the host clock). Not a mean, and not the
    event windows beside the spans: a forgery that kept either while lowering the median
    would otherwise pass."""
    return float(stats.get("median_ms") or 0.0)
