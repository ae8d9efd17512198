"""Fresh data for every timed replay.

Between two timed calls, outside the timed span, the guard
- refills the call's input buffers in place with the inputs of a new seed (made by the same
  ``InputMaker`` as every other input, so custom generators and index conventions hold);
- overwrites the outputs it can reach (a graph's static outputs, destination-passing
  buffers) with new random values, never a fixed poison;
- takes a digest of what the call returned: per output, its sum, L1 and L2 norms and its
  projection on random signs drawn from the run's seed, all accumulated in float64, and the
  values of ``SAMPLES`` of its elements at positions drawn from the same seed anew for every
  call.

The trusted worker later makes the same inputs for a secret sample of replays, runs the
reference and checks each digest against the reference's within the problem's tolerance
(``digest_mismatch``; a CPU loop's outputs, which the guard reads itself, are compared
element by element instead: ``replay_check``). The sums and norms tell a skipped, stale or remembered
result from a computed one; the sampled elements hold each of those elements to the
tolerance itself, as a correctness round does, so that an approximation returned on timed
calls only, whose sums and norms stay close to the answer's, fails too (red team, session 27). A candidate cannot tell a checked replay from another one: it computes
no digest itself, the guard's code does for every replay. Work that depends on anything but
the current inputs (a remembered answer, a cache keyed by address or by sampled values, a
graph that copies what it saw at capture, a test for the poison) then fails the check.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from .common import is_torch_result_tuple
from .harness import T
from .compare import OUTLIER_FACTOR
from .held_atol import NO_GAP, ReferenceGap, held_atol
from .inputs import sub_seed

# a digest's layout (the messages carry it): its fields, then the values of SAMPLES elements
# at positions drawn from the seed for each call (``Projection.positions``)
from .messages import DIGEST_FIELDS, DIGEST_WIDTH
from .messages import DIGEST_SAMPLES as SAMPLES

# Random signs are drawn once per run for a period of at least this many elements and repeated
# along larger outputs, so a digest needs no output-sized weight tensor. The period itself is
# drawn from the seed too, up to PERIOD_SPREAD more: with a fixed one, swapping elements a
# period apart changed no field of the digest, for any seed and without reading anything (red
# team, session 47); now which swaps the projection is blind to is as secret as its signs.
PROJECTION_PERIOD = (1 << 20) + 7
PERIOD_SPREAD = 1 << 16
# The projection of an honest result's error on signs independent of it exceeds this many
# times the error's L2 bound with probability below 2 exp(-k^2 / 2) (Hoeffding): 3e-8 at 6.
PROJECTION_SIGMAS = 6.0


# The signs' random bits come in words of this many, each word uniform in [0, 2**SIGN_WORD_BITS)
# (a power of two: every bit uniform and independent of the others).
SIGN_WORD_BITS = 62


class Projection:
    """Random signs (+1/-1) from a seed, the same in every worker given the seed: drawn on the
    CPU with torch's generator as words of random bits, then moved, unpacked and kept per device,
    in float64 (a dot product in float64 of each chunk, converted, with the signs). With them,
    the positions of each call's sampled elements: ``calls`` sets of them per output size, one
    per call of a loop.

    About five are made per timed workload (the timed loop's and the outside clock's, in both
    workers). Drawn one bit at a time on the CPU, converted to float64 there and moved as 8 MB,
    each cost milliseconds (session 37's profile; the audit of session 47): now 17K words are
    drawn, moved and unpacked on the device."""

    def __init__(self, seed: int, calls: int = 1):
        self.seed = seed
        self.calls = max(1, calls)
        # high bits: a sub-seed's low ones depend on the seed's low ones alone
        self.period = PROJECTION_PERIOD + (sub_seed(seed, "period") >> 24) % PERIOD_SPREAD
        self._words = self._draw(seed, self.period)
        self._cache: dict[str, torch.Tensor] = {}
        self._tables: dict[tuple[str, int], torch.Tensor] = {}
        self._rows: dict[tuple[str, int, int], torch.Tensor] = {}

    @staticmethod
    def _draw(seed: int, period: int) -> torch.Tensor:
        gen = torch.Generator(device="cpu").manual_seed(sub_seed(seed, "projection"))
        words = -(-period // SIGN_WORD_BITS)
        return torch.randint(0, 1 << SIGN_WORD_BITS, (words,), generator=gen, dtype=torch.int64)

    def weights(self, device: torch.device) -> torch.Tensor:
        """Rows (ones, signs), shape (2, period), float64 on ``device``: one matrix product
        with a block gives both its sum and its projection."""
        key = str(device)
        if key not in self._cache:
            words = self._words.to(device)
            shifts = torch.arange(SIGN_WORD_BITS, device=device, dtype=torch.int64)
            bits = torch.bitwise_and(torch.bitwise_right_shift(words.unsqueeze(1), shifts), 1)
            signs = bits.reshape(-1)[: self.period].to(torch.float64) * 2 - 1
            self._cache[key] = torch.stack([torch.ones_like(signs), signs])
        return self._cache[key]

    def _row(self, n: int, call: int) -> torch.Tensor:
        # each call's positions from a generator of its own, so that one call's can be drawn
        # without the others' (the trusted worker draws only the calls it checks)
        gen = torch.Generator(device="cpu").manual_seed(sub_seed(self.seed, "samples", n, call))
        return torch.randint(0, max(n, 1), (SAMPLES,), generator=gen, dtype=torch.long)

    def table(self, n: int, device: torch.device) -> torch.Tensor:
        """The ``SAMPLES`` element positions (with repeats) of a flat output of ``n`` elements
        for each of the ``calls`` calls, shape (calls, SAMPLES): drawn on the CPU, then moved,
        and kept per device and size, so that a digest captured in a graph finds them made
        (``DigestTable``) and a loop's digests move nothing after its first call. Drawn anew
        for every call: an honest result whose few misses sit at fixed places misses at
        different samples on different calls, so the calls' misses can be counted together
        (``replay_check.SampleTally``)."""
        key = (str(device), n)
        if key not in self._tables:
            drawn = torch.stack([self._row(n, c) for c in range(self.calls)])
            self._tables[key] = drawn.to(device)
        return self._tables[key]

    def positions(self, n: int, device: torch.device, call: int = 0) -> torch.Tensor:
        """Call ``call``'s ``SAMPLES`` positions in a flat output of ``n`` elements, the same
        in every worker given the seed; a call beyond ``calls`` has its own drawn alone."""
        if call < self.calls:
            row: torch.Tensor = self.table(n, device)[call]
            return row
        key = (str(device), n, call)
        if key not in self._rows:
            self._rows[key] = self._row(n, call).to(device)
        return self._rows[key]


def replay_seed(run_seed: int, iteration: int) -> int:
    """The seed of the inputs of timed call ``iteration`` of a run."""
    return sub_seed(run_seed, "replay", iteration)


def tensors_of(out: Any) -> list[torch.Tensor]:
    """The tensors of an output structure (tensor, tuple, list, dict, torch's result tuples),
    in order. Exact container types only: a subclass would run the candidate's code here."""
    kind = T.type(out)
    if kind is T.tensor_type:
        return [out]
    if kind is tuple or kind is list or is_torch_result_tuple(kind):
        return [t for o in out for t in tensors_of(o)]
    if kind is dict:
        return [t for o in out.values() for t in tensors_of(o)]
    return []


def scramble(out: Any, gen: torch.Generator) -> None:
    """Overwrite output tensors with new random values (floats in [-4, 4), integers in
    their range, booleans at random), so a call that skips its work leaves values that no
    earlier call produced."""
    for t in tensors_of(out):
        if not t.numel():
            continue
        if t.is_floating_point():
            t.uniform_(-4.0, 4.0, generator=gen)
        elif t.dtype == torch.bool:
            t.random_(0, 2, generator=gen)
        elif t.is_complex():
            T.view(t, torch.float32 if t.dtype == torch.complex64 else torch.float64).uniform_(-4, 4, generator=gen)
        else:
            t.random_(generator=gen)


def _as_real(t: torch.Tensor) -> torch.Tensor:
    x = t if t.is_floating_point() or t.is_complex() else T.to(t, torch.float64)
    return torch.view_as_real(x) if x.is_complex() else x


# Periods per float64 block of a digest: few launches on a large output (the loop runs a digest
# after every timed call, and the outside clock's band grows with the loop's own cost), while
# the float64 copy stays at most half the output's own size or 64 MiB, whichever is more (the
# H200 profile of session 12: 8 blocks of 7 launches each on a 32 MiB output, 1.5 ms of host
# time per digest).
DIGEST_BLOCK_PERIODS = 16
DIGEST_BLOCK_FLOOR_PERIODS = 8  # 8 periods of float64: 64 MiB


def _block(flat: torch.Tensor, r0: int, r1: int, period: int) -> torch.Tensor:
    """Periods ``r0`` to ``r1`` of ``flat`` as a float64 copy of shape (r1 - r0, period); the
    last block's tail zero-padded to a whole period (zeros change no field)."""
    part = flat[r0 * period : r1 * period]
    if T.numel(part) == (r1 - r0) * period:
        c = T.to(part, torch.float64)
    else:
        c = T.zeros((r1 - r0) * period, dtype=torch.float64, device=flat.device)
        T.copy_(c[: T.numel(part)], part)
    block: torch.Tensor = T.view(c, (r1 - r0, period))
    return block


def _digest_one(x: torch.Tensor, projection: Projection, call: int | torch.Tensor) -> torch.Tensor:
    """(sum, L1, L2, projection, then ``SAMPLES`` of its elements) of one tensor, in float64:
    one gather and one concatenation beside the fields (``_fields``). ``call``: whose sampled
    positions, a number or a one-element device tensor (a captured digest's row counter)."""
    flat = T.reshape(x, (-1,))
    n = T.numel(flat)
    if n == 0:
        zero: torch.Tensor = T.zeros(DIGEST_WIDTH, dtype=torch.float64, device=flat.device)
        return zero
    if isinstance(call, int):
        where = projection.positions(n, flat.device, call)
    else:  # the call's row of the table, chosen on the device
        where = T.reshape(T.index_select(projection.table(n, flat.device), 0, call), (-1,))
    samples = T.to(T.index_select(flat, 0, where), torch.float64)
    row: torch.Tensor = T.cat([_fields(flat, n, projection), samples])
    return row


def _fields(flat: torch.Tensor, n: int, projection: Projection) -> torch.Tensor:
    """The digest's fields (``DIGEST_FIELDS``) of a flat tensor of ``n`` elements (n > 0), a
    block of whole periods at a time: one float64 copy of a block at most, never of a whole
    large output. The last block takes the tail too, zero-padded to a whole period (zeros
    change no field), so an output of up to ``per_block`` periods is one block: its copy, one
    matrix product by (ones, signs) and the sum of its rows, the two norms, one stack. Each
    launch is tens of microseconds of host time with the profiler recording, after every
    timed call."""
    period = projection.period
    w = projection.weights(flat.device)
    if n < period:  # part of one period: the weights cut to it, no padding
        c = T.to(flat, torch.float64)
        sp = T.mv(w[:, :n], c)
        small: torch.Tensor = T.stack([sp[0], T.vector_norm(c, 1), T.vector_norm(c, 2), sp[1]])
        return small
    half_output = (n * flat.element_size()) // (2 * 8 * period)
    per_block = max(1, min(DIGEST_BLOCK_PERIODS, max(DIGEST_BLOCK_FLOOR_PERIODS, half_output)))
    rows = -(-n // period)
    if rows <= per_block:
        c = _block(flat, 0, rows, period)
        sp = T.sum(T.mm(c, w.t()), 0)
        one: torch.Tensor = T.stack([sp[0], T.vector_norm(c, 1), T.vector_norm(c, 2), sp[1]])
        return one
    # several blocks, each let go before the next is made (on a GPU inside a captured graph
    # too: its pool reuses what the capture frees), so that a digest of a 7 GiB float32 output
    # holds 128 MiB of float64 and not 14 GiB; their sums of squares add up, the root is taken once
    parts = []
    for r0 in range(0, rows, per_block):
        c = _block(flat, r0, min(rows, r0 + per_block), period)
        sp = T.sum(T.mm(c, w.t()), 0)
        c_flat = T.reshape(c, (-1,))
        parts.append(T.stack([sp[0], T.vector_norm(c_flat, 1), T.dot(c_flat, c_flat), sp[1]]))
        del c, c_flat
    acc = T.sum(T.stack(parts), 0)
    summed: torch.Tensor = T.stack([acc[0], acc[1], T.sqrt(acc[2]), acc[3]])
    return summed


def digest(outputs: list[Any], projection: Projection, call: int | torch.Tensor = 0) -> torch.Tensor:
    """Per output: (sum, L1 norm, L2 norm, projection, sampled elements) in float64, as one
    device tensor of shape (n_outputs, DIGEST_WIDTH), the elements at call ``call``'s
    positions. A non-tensor output digests as NaN (the check then fails)."""
    rows = []
    for t in outputs:
        if T.type(t) is not T.tensor_type:
            rows.append(torch.full((DIGEST_WIDTH,), float("nan"), dtype=torch.float64))
            continue
        rows.append(_digest_one(_as_real(t), projection, call))
    if not rows:
        return torch.zeros((0, DIGEST_WIDTH), dtype=torch.float64)
    if len(rows) == 1:  # a view, no launch
        only: torch.Tensor = T.view(rows[0], (1, DIGEST_WIDTH))
        return only
    device = rows[0].device
    return torch.stack([r.to(device) for r in rows])


class DigestTable:
    """The digests of a loop's calls on the device, row ``i`` for call ``i``: after each call,
    the digest of set ``k``'s output buffers (``static[k]``, the same tensors every call), its
    sampled elements at call ``i``'s positions (the projection must draw as many calls as the
    table has rows). On a GPU each set's digest is one captured graph, which picks the call's
    positions by the row counter it keeps on the device, so a call's digest costs one launch
    instead of tens (the loop's own cost is what the outside clock's band and the timed loop's
    host time grow with); ``graphs`` False computes it eagerly, as on the CPU."""

    def __init__(
        self,
        device: torch.device | str,
        static: list[list[torch.Tensor]],
        rows: int,
        projection: Projection,
        graphs: bool,
        pool: Any = None,
    ):
        device = torch.device(device)
        self.device, self.static, self.projection = device, static, projection
        self.rows = max(1, rows)
        if projection.calls < self.rows:
            raise ValueError(
                f"a table of {self.rows} digests needs positions for as many calls, not {projection.calls}"
            )
        projection.weights(device)  # made before any capture, as the sampled positions
        for outs in static:
            for t in outs:
                if t.numel():
                    projection.table(_as_real(t).numel(), device)
        n_out = len(static[0]) if static else 0
        self.table = torch.zeros((self.rows, n_out, DIGEST_WIDTH), dtype=torch.float64, device=device)
        self.counter = torch.zeros(1, dtype=torch.long, device=device)
        self.graphs: list[Any] = []
        if graphs:
            self._capture(pool)

    def _digest(self, k: int) -> None:
        d = digest(self.static[k], self.projection, self.counter)
        self.table.index_copy_(0, self.counter, d.unsqueeze(0))
        self.counter.add_(1)

    def _capture(self, pool: Any) -> None:
        """One graph per set (a warm-up on a side stream first, as for any capture), replayed
        once so that its upload is not in a window."""
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        # every warm-up digest and replay goes to row 0: a loop may have fewer rows than twice
        # its sets (an eager loop that stopped early), and a row past the table, or a call past
        # the positions drawn, is an index the device refuses with an assert
        with torch.cuda.stream(side):
            for k in range(len(self.static)):
                self.reset()
                self._digest(k)
        torch.cuda.current_stream(self.device).wait_stream(side)
        T.cuda_sync()
        self.reset()
        pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        for k in range(len(self.static)):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self._digest(k)
            self.graphs.append(g)
        for g in self.graphs:
            self.reset()
            T.graph_replay(g)
        T.cuda_sync()
        self.reset()

    def reset(self) -> None:
        """The next call's digest goes to row 0."""
        T.zero_(self.counter)

    def step(self, k: int) -> None:
        """The digest of set ``k``'s outputs as they are now, into the next row."""
        if self.graphs:
            T.graph_replay(self.graphs[k])
        else:
            self._digest(k)

    def read(self, n: int) -> list[Any]:
        """The first ``n`` rows: per call, per output, the digest's fields."""
        if not 0 <= n <= self.rows:
            raise ValueError(f"{n} digests asked of a table of {self.rows}")
        rows: list[Any] = T.to(self.table[:n], "cpu").tolist()
        return rows


def digest_bounds(
    ref: torch.Tensor,
    atol: float,
    rtol: float,
    projection: Projection,
    matched_ratio: float = 1.0,
    outlier_error: float | None = None,
    call: int = 0,
    gap: ReferenceGap = NO_GAP,
    spacing: float = 0.0,
) -> tuple[list[float], list[float]]:
    """The reference's digest and, for each of its entries, how far a candidate's may lie from
    it when every element satisfies ``|out - ref| <= atol + rtol * |ref|``: for the sum and the
    L1 norm the sum of the per-element allowances, for the L2 norm its L2 norm (triangle
    inequality), for the projection on random signs ``PROJECTION_SIGMAS`` times that L2 norm
    (an honest error does not depend on the signs), for each sampled element its own
    allowance. The first three are necessary conditions of the element-wise check; the
    projection is what catches a result made for other inputs, whose norms are much the same;
    the samples catch a result that is off by more than the tolerance on many elements while
    its sums stay close. ``call``: whose sampled positions (the call the digest was taken of).

    A tolerance that lets a share of the elements miss (``matched_ratio`` below 1, SOL-ExecBench's
    ``required_matched_ratio``) adds, for that many elements, ``outlier_error`` each (the most
    an element the ratio lets through may be off; by default ``OUTLIER_FACTOR`` times the
    largest element's allowance, as the correctness comparison bounds it); for the samples
    ``digest_mismatch`` counts the misses.

    ``atol`` is held down to the reference's size (its RMS, from the digest's L2 norm), with the
    floors that ``gap`` and ``spacing`` (the output dtype's ``resolution``) give
    (``held_atol``), as the correctness comparison holds every element."""
    x = _as_real(ref)
    n = x.numel()
    values = digest([x], projection, call)[0].tolist()
    l1, l2 = values[1], values[2]
    # the L2 norm counts every element: a reference with an infinity keeps the stated atol here
    atol = held_atol(atol, rtol, l2 / math.sqrt(n) if n else 0.0, gap, spacing).atol
    allow_sum = n * atol + rtol * l1
    allow_l2 = math.sqrt(n) * atol + rtol * l2
    misses = math.floor((1.0 - matched_ratio) * n) if matched_ratio < 1.0 else 0
    if misses and n:
        largest = float(T.to(x.abs().max(), torch.float64)) if math.isfinite(l1) else math.inf
        worst = OUTLIER_FACTOR * (atol + rtol * largest)
        worst = min(worst, outlier_error) if outlier_error is not None else worst
        allow_sum += misses * worst
        allow_l2 += math.sqrt(misses) * worst
    samples = [atol + rtol * abs(v) for v in values[len(DIGEST_FIELDS) :]]
    return values, [allow_sum, allow_sum, allow_l2, PROJECTION_SIGMAS * allow_l2, *samples]


# The chance, for a result whose elements miss their tolerance exactly as often as the matched
# ratio allows, that its sampled elements miss more often than ``misses_allowed`` lets pass: a
# false accusation of an honest kernel at the limit, per check.
FALSE_ALARM = 1e-9


@functools.cache
def misses_allowed(samples: int, matched_ratio: float) -> int:
    """How many of ``samples`` sampled elements may miss their tolerance when a share
    ``1 - matched_ratio`` of all elements may: the smallest count that a result just meeting
    the ratio exceeds with probability at most ``FALSE_ALARM`` (the binomial tail, exactly;
    9 of 64 at 0.99, 34 of 1024); 0 at a ratio of 1."""
    if matched_ratio >= 1.0 or samples <= 0:
        return 0
    p = 1.0 - matched_ratio
    log_p, log_q = math.log(p), math.log1p(-p)

    def term(i: int) -> float:
        return math.exp(
            math.lgamma(samples + 1)
            - math.lgamma(i + 1)
            - math.lgamma(samples - i + 1)
            + i * log_p
            + (samples - i) * log_q
        )

    tail = 1.0 - term(0)  # P(X > 0)
    k = 0
    while tail > FALSE_ALARM and k < samples:
        k += 1
        tail -= term(k)
    return k


@dataclass(frozen=True)
class Samples:
    """How one output's sampled elements compare with the reference's: how many miss their
    tolerance, the first that does, and the first that is off by more than
    ``OUTLIER_FACTOR`` times its allowance (no element the ratio lets through may be)."""

    misses: int
    first: int | None
    far: int | None


def compare_samples(got: list[float], ref: list[float], allow: list[float]) -> Samples:
    """The sampled elements of a digest row against the reference's, as the correctness
    comparison holds every element: within ``atol + rtol * |ref|``, a NaN or infinity only
    where the reference has the same."""
    misses, first, far = 0, None, None
    for k in range(len(DIGEST_FIELDS), DIGEST_WIDTH):
        g, r, a = got[k], ref[k], allow[k]
        if math.isnan(r):
            ok, near = math.isnan(g), False
        elif math.isinf(r):
            ok, near = g == r, False
        else:
            err = abs(g - r) if math.isfinite(g) else math.inf
            ok, near = err <= a + 1e-12 * abs(r), err <= OUTLIER_FACTOR * a
        if not ok:
            misses += 1
            first = k if first is None else first
            far = k if far is None and not near else far
    return Samples(misses, first, far)


def digest_mismatch(
    got: list[float], ref: list[float], allow: list[float], name: str, matched_ratio: float = 1.0
) -> str | None:
    """Why a candidate's digest of one output cannot come from a result within tolerance,
    or None. Float64 rounding of the reductions themselves is allowed for. ``got`` comes from
    the candidate's process: a row without every entry is a mismatch (an empty row once
    matched everything, and a kernel that skipped every timed call was ACCEPTed). Sampled
    elements that miss may only be as many as the ratio lets pass (``misses_allowed``): per
    call here, and over all the calls checked together by ``replay_check.SampleTally``, whose
    count is the sharper test (each call's positions are drawn anew, so its misses are new
    draws)."""
    if len(got) != DIGEST_WIDTH or len(ref) != DIGEST_WIDTH or len(allow) != DIGEST_WIDTH:
        return f"output {name!r}: {len(got)} digest entries where there are {DIGEST_WIDTH}"
    for field, g, r, a in zip(DIGEST_FIELDS, got, ref, allow):
        if not math.isfinite(r):
            continue  # the reference itself overflows here: nothing to hold the candidate to
        slack = a + 1e-9 * (abs(r) + abs(g)) + 1e-12
        if not math.isfinite(g) or abs(g - r) > slack:
            return (
                f"output {name!r}: {field} {g:.6g} where the reference gives {r:.6g} "
                f"(at most {a:.3g} apart for a result within tolerance)"
            )
    s = compare_samples(got, ref, allow)
    allowed = misses_allowed(SAMPLES, matched_ratio)
    if s.far is None and s.misses <= allowed:
        return None
    k = s.far if s.far is not None else s.first
    assert k is not None
    return (
        f"output {name!r}: {s.misses} of {SAMPLES} sampled elements outside the tolerance"
        + (f" ({allowed} may be, for required_matched_ratio={matched_ratio:g})" if allowed else "")
        + (f", one more than {OUTLIER_FACTOR:g}x its allowance" if s.far is not None and allowed else "")
        + f"; sample {k - len(DIGEST_FIELDS)}: got {got[k]:.6g}, expected {ref[k]:.6g} (allowance {allow[k]:.3g})"
    )
