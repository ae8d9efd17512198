"""Refilling a timed call's live input buffers in place with the inputs of a new seed.

The buffers stay where they are (a captured graph reads them); their values are new for every
timed call, so that nothing a kernel worked out from one call's inputs holds for the next.
Inputs the guard makes at random are redrawn where they lie, one draw per tensor:
- floats by ``normal_``, then each row (the last dimension) scaled by its own factor drawn in
  [1/2, 2] (``ROW_SCALE_OCTAVES``): a kernel that is right only for standard-normal rows (a
  softmax that takes each row's sum to be its expectation, a cross-entropy that skips the
  vocabulary) is then wrong on timed calls, where it was right within tolerance on every
  element (red team, session 27). The correctness rounds' mixed kind spans 1e-3 to 1e3 with
  row-scaled tolerances; the timed calls' range is narrow enough that the plain tolerance
  holds an honest kernel as at scale 1;
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


# A timed call's float rows are scaled by 2**u, u uniform in [-ROW_SCALE_OCTAVES, ROW_SCALE_OCTAVES].
ROW_SCALE_OCTAVES = 1.0

# Offsets' steps are drawn in [1, OFFSET_STEP_HIGH): segments up to 255 times as long as one
# another, and a scaled sum far from int64's limit for any count of offsets and indices a
# device holds.
OFFSET_STEP_HIGH = 256


# Buffers a refill works in, made on first use and kept (a captured graph reads them), keyed by
# their own kind, shape and device: each is consumed as soon as it is written, so inputs of one
# shape share one. Never by an input's address alone: the trusted worker makes each checked
# call's inputs anew, and a freed input's address is soon another's, of another shape.
Scratch = dict[tuple[Any, ...], torch.Tensor]


def redraw(t: torch.Tensor, draw: Draw, gen: torch.Generator, scratch: Scratch) -> None:
    """One input redrawn in place. Float8, which has no ``normal_``, through a float16 buffer of
    its shape, offsets through int64 buffers and the row scales through a buffer of one per
    row, kept in ``scratch`` (made on first use, so before any graph capture)."""
    if draw.kind == "offsets":
        _redraw_offsets(t, draw.bound, gen, scratch)
    elif draw.kind == "int":
        T.random_(t, 0, 2 if t.dtype == torch.bool else max(1, draw.bound), generator=gen)
    elif t.element_size() > 1:
        T.normal_(t, generator=gen)
        _scale_rows(t, gen, scratch)
    else:
        key = ("float16", tuple(t.shape), str(t.device))
        buf = scratch.get(key)
        if buf is None:
            buf = scratch[key] = T.empty(t.shape, dtype=torch.float16, device=t.device)
        T.normal_(buf, generator=gen)
        _scale_rows(buf, gen, scratch)
        T.copy_(t, buf)


def _scale_rows(t: torch.Tensor, gen: torch.Generator, scratch: Scratch) -> None:
    """Each row of ``t`` (its last dimension; a vector is one row) times 2**u, u drawn
    uniform in [-ROW_SCALE_OCTAVES, ROW_SCALE_OCTAVES] for each row."""
    if T.numel(t) == 0:
        return
    shape = tuple(t.shape[:-1]) + (1,) if t.dim() > 1 else (1,)
    # the scales in the input's own dtype: a bfloat16 tensor times float32 scales takes a
    # mixed-dtype path 25 times slower on a CPU than one of a single dtype (0.3 s against
    # 0.011 s for a 24576 x 3072 weight), paid on every timed call's refill
    key = ("rows", shape, t.dtype, str(t.device))
    scales = scratch.get(key)
    if scales is None:
        scales = scratch[key] = T.empty(shape, dtype=t.dtype, device=t.device)
    T.uniform_(scales, -ROW_SCALE_OCTAVES, ROW_SCALE_OCTAVES, generator=gen)
    T.exp2_(scales)
    T.mul_(t, scales)


def _redraw_offsets(t: torch.Tensor, count: int, gen: torch.Generator, scratch: Scratch) -> None:
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
    key = ("offsets", k, str(t.device))
    buf = scratch.get(key)
    if buf is None:  # the steps, then their last sum in the final element
        buf = scratch[key] = T.empty((k,), dtype=torch.int64, device=t.device)
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
        self.scratch: Scratch = {}

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
        self.scratch: Scratch = {}

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
