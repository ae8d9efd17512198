"""Refilling a timed call's live input buffers in place with the inputs of a new seed.

The buffers stay where they are (a captured graph reads them); their values are new for every
timed call, so that nothing a kernel worked out from one call's inputs holds for the next.
Inputs the guard makes at random are redrawn where they lie, one draw per tensor:
- floats by ``normal_``;
- integers and booleans uniform in the range the ``InputMaker`` draws them in (indices below
  the page count, labels below the classes);
- offsets (``kv_indptr``, ``cu_seqlens``) as a non-decreasing run from 0 to the count of the
  indices they split, as the ``InputMaker`` makes them: positive steps drawn at random,
  summed and scaled to end at that count (no sort and no allocation, so the draws of a set
  can be captured in a graph; every segment is new on every call).
Every step goes through the references the harness took before the candidate's code loaded
(``T``), watched for patching: a refill is outside the timed span, and work a candidate hid
in a patched ``random_`` would be done there.
Loaded inputs keep their set's values (the problem fixes them). Inputs made by a custom
generator, and inputs of which none is a float, go through the ``InputMaker`` again.

Before session 22 integers and offsets kept their set's values: work that depends on them
alone (a split plan, a histogram), keyed by address, stayed right on every timed call of the
set, and a kernel could rewrite them in place with its outputs still right (indices sorted
within a row) and find that work done on later calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from .harness import T
from .inputs import InputMaker, sub_seed
from .refill_kinds import INDICES, INDPTR, is_float_dtype, redrawn_inputs, stream_refill_possible

__all__ = ["Draw", "Refiller", "StreamRefill", "draws_of", "redraw"]


@dataclass(frozen=True)
class Draw:
    """How one input is redrawn: ``bound`` is an integer's exclusive upper bound, or the last
    value of a run of offsets."""

    position: int
    name: str
    kind: Literal["float", "int", "offsets"]
    bound: int = 0


def draws_of(maker: InputMaker, workload: dict[str, Any], axes: dict[str, int]) -> list[Draw]:
    """The draws of a workload's redrawn inputs, in definition order."""
    specs = maker.d["inputs"]
    redrawn = redrawn_inputs(maker.d, workload)
    indices = sorted(n for _, n in redrawn if INDICES.search(n) and not is_float_dtype(str(specs[n]["dtype"])))
    out = []
    for j, name in redrawn:
        if is_float_dtype(str(specs[name]["dtype"])):
            out.append(Draw(j, name, "float"))
        elif INDPTR.search(name):
            out.append(Draw(j, name, "offsets", maker.offsets_end(name, axes, indices)))
        else:
            out.append(Draw(j, name, "int", maker.int_high(name, axes)))
    return out


# Offsets' steps are drawn in [1, OFFSET_STEP_HIGH): segments up to 255 times as long as one
# another, and a scaled sum far from int64's limit for any count of offsets and indices a
# device holds.
OFFSET_STEP_HIGH = 256


def redraw(t: torch.Tensor, draw: Draw, gen: torch.Generator, scratch: dict[int, torch.Tensor]) -> None:
    """One input redrawn in place. Float8, which has no ``normal_``, through a float16 buffer of
    its shape, and offsets through int64 buffers, kept in ``scratch`` (made on first use, so
    before any graph capture)."""
    if draw.kind == "offsets":
        _redraw_offsets(t, draw.bound, gen, scratch)
    elif draw.kind == "int":
        T.random_(t, 0, 2 if t.dtype == torch.bool else max(1, draw.bound), generator=gen)
    elif t.element_size() > 1:
        T.normal_(t, generator=gen)
    else:
        buf = scratch.get(T.data_ptr(t))
        if buf is None:
            buf = scratch[T.data_ptr(t)] = T.empty(t.shape, dtype=torch.float16, device=t.device)
        T.normal_(buf, generator=gen)
        T.copy_(t, buf)


def _redraw_offsets(t: torch.Tensor, count: int, gen: torch.Generator, scratch: dict[int, torch.Tensor]) -> None:
    """``t`` as offsets into ``count`` indices: 0 first, ``count`` last (two or more offsets),
    non-decreasing between: positive steps drawn at random, their running sum ``S`` scaled to
    ``S * count // S[-1]``. Every run of offsets has a chance, none repeats call after call."""
    flat = T.view(t, (-1,))
    k = T.numel(flat)
    if k == 0:
        return
    T.fill_(flat[:1], 0)
    if k == 1:
        return
    buf = scratch.get(T.data_ptr(t))
    if buf is None:  # the steps, then their last sum in the final element
        buf = scratch[T.data_ptr(t)] = T.empty((k,), dtype=torch.int64, device=t.device)
    steps, last = buf[: k - 1], buf[k - 1 :]
    T.random_(steps, 1, OFFSET_STEP_HIGH, generator=gen)
    T.cumsum_(steps, 0)
    T.copy_(last, steps[-1:])
    T.mul_(steps, count)
    T.div_(steps, last, rounding_mode="floor")
    T.copy_(flat[1:], steps)


class StreamRefill:
    """Redraws the random inputs of the live sets from one generator, seeded once per loop and
    drawn on in order: the inputs of call ``i`` are those of the ``i``-th draw. On a GPU the
    draws of one set are captured in a graph (the generator is registered with it), so a
    refill costs one launch; the trusted worker gets the same values by replaying the same
    draws from the same seed."""

    def __init__(self, draws: list[Draw], device: torch.device):
        self.draws = draws
        self.gen = torch.Generator(device=device)
        self.scratch: dict[int, torch.Tensor] = {}

    def seed(self, seed: int) -> None:
        self.gen.manual_seed(sub_seed(seed, "stream"))

    def __call__(self, live: list[Any]) -> None:
        for d in self.draws:
            redraw(live[d.position], d, self.gen, self.scratch)


class Refiller:
    """Refills a call's live input buffers with the inputs of a new seed, one generator seeded
    per input: cheap enough to run before every timed call. ``custom``: remade whole by the
    ``InputMaker`` (a custom generator, or no random float to redraw)."""

    def __init__(self, maker: InputMaker, workload: dict[str, Any], axes: dict[str, int]):
        self.maker, self.workload, self.axes = maker, workload, axes
        self.custom = not stream_refill_possible(maker.d, workload)
        self.draws = draws_of(maker, workload, axes)
        self.gen = torch.Generator(device=maker.device)
        self.scratch: dict[int, torch.Tensor] = {}

    def __call__(self, live: list[Any], seed: int) -> None:
        if self.custom:
            fresh = self.maker.make(self.workload, self.axes, seed, "normal")
            for buf, new in zip(live, fresh):
                if T.type(buf) is T.tensor_type:
                    T.copy_(buf, new)
            del fresh
            return
        for d in self.draws:
            self.gen.manual_seed(sub_seed(seed, d.name))
            redraw(live[d.position], d, self.gen, self.scratch)
