"""The element-wise statistics of one comparison, gathered a chunk at a time.

A chunk of ``chunk_elements`` elements of the candidate's output and of the reference is
widened to float64, checked and reduced to a few numbers before the next chunk is read, so a
comparison never holds more than a handful of float64 chunks besides the two tensors
themselves: about ``WORKING_BYTES_PER_ELEMENT * chunk_elements`` bytes, whatever the output's
size. Every figure the report needs (counts, maxima and where they are, the first failing
element) folds across chunks exactly as it would over the whole tensor; ties go to the
earliest element, as torch's own ``argmax`` on one tensor does.

Rows (the last dimension) matter for the adversarial rounds' allowance, which grows with the
root mean square of the reference's row: chunks then hold whole rows, and a row longer than a
chunk has its mean square summed over its pieces first.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .messages import DEFAULT_CHUNK_ELEMENTS

# DEFAULT_CHUNK_ELEMENTS (1M elements, in the torch-free protocol module): 8 MiB per float64
# temporary, about 60 MiB for a chunk's whole working set as planned. That holds where an
# allocator caches blocks (a GPU's); on the CPU the temporaries come from the C heap, which
# fragments: a 1M chunk held 119 to 160 MiB there, so the guard compares 256K elements at a
# time on the CPU (``GuardConfig.cpu_compare_chunk_elements``).

# float64 temporaries alive at once inside a chunk (x, y, error, allowance and the transient
# ones of an expression), 8 bytes each, and six boolean masks: what one chunk costs at most.
WORKING_BYTES_PER_ELEMENT = 7 * 8 + 6


def flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one dimension: a view where its memory allows, else one copy in its own dtype
    (never a wider one)."""
    return t.reshape(-1)


@dataclass
class Extreme:
    """The largest value seen so far, where it is and the two elements there. A NaN counts as
    the largest (torch's ``argmax`` returns it), the first one seen wins."""

    value: float = -math.inf
    index: int = -1
    got: float | int | bool = math.nan
    want: float | int | bool = math.nan

    def offer(self, values: torch.Tensor, offset: int, x: torch.Tensor, y: torch.Tensor) -> None:
        i = int(values.argmax().item())
        v = float(values[i].item())
        if self.index >= 0 and (math.isnan(self.value) or not (math.isnan(v) or v > self.value)):
            return
        self.value, self.index = v, offset + i
        self.got, self.want = x[i].item(), y[i].item()


@dataclass
class First:
    """The first element of a mask, over chunks: where it is and the two elements there."""

    index: int = -1
    got: float | int | bool = math.nan
    want: float | int | bool = math.nan

    def offer(self, mask: torch.Tensor, offset: int, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.index >= 0 or not bool(mask.any().item()):
            return
        i = int(mask.nonzero()[0].item())
        self.index, self.got, self.want = offset + i, x[i].item(), y[i].item()


@dataclass
class Scan:
    """What a float comparison reports, over every chunk."""

    numel: int = 0
    mismatches: int = 0
    nan: int = 0
    inf: int = 0
    outliers: int = 0  # failing elements past ``outlier_factor`` x their allowance
    max_abs: float = 0.0
    max_rel: float = 0.0
    first_fail: First = field(default_factory=First)
    first_special: First = field(default_factory=First)  # NaN/Inf where the reference is not
    worst_abs: Extreme = field(default_factory=Extreme)  # largest error
    worst_fail: Extreme = field(default_factory=Extreme)  # failing element furthest past its allowance
    worst_excess: Extreme = field(default_factory=Extreme)  # failing element's error / its allowance


def scan_floats(
    out: torch.Tensor,
    ref: torch.Tensor,
    atol: float,
    rtol: float,
    row_scaled: bool,
    outlier_factor: float,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> Scan:
    """The statistics of ``out`` against ``ref`` (same shape, any float dtypes)."""
    scan = Scan(numel=out.numel())
    for start, x, y, row_rms in _chunks(out, ref, row_scaled, chunk_elements):
        _fold(scan, x, y, start, atol, rtol, row_rms, outlier_factor)
        del x, y
    return scan


def _chunks(
    out: torch.Tensor, ref: torch.Tensor, row_scaled: bool, chunk_elements: int
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, float | torch.Tensor | None]]:
    """(offset, the output's chunk and the reference's in float64, the rows' RMS where
    ``row_scaled``) for each chunk in turn."""
    xs, ys = flat(out), flat(ref)
    row = int(ref.shape[-1]) if row_scaled and ref.dim() >= 1 else 0
    for start, stop, piece_rms in _pieces(ys, row, max(1, int(chunk_elements))):
        x = xs[start:stop].to(torch.float64)
        y = ys[start:stop].to(torch.float64)
        row_rms: float | torch.Tensor | None = piece_rms
        if row and row_rms is None:  # whole rows in this chunk
            rows = torch.where(torch.isfinite(y), y, 0.0).view(-1, row)
            row_rms = rows.pow(2).mean(dim=-1, keepdim=True).sqrt().expand(-1, row).reshape(-1)
        yield start, x, y, row_rms


def _pieces(ys: torch.Tensor, row: int, chunk: int) -> Iterator[tuple[int, int, float | None]]:
    """(start, stop, row RMS or None) of each chunk. Without rows: plain ranges. With rows
    that fit: ranges of whole rows, their RMS left to the caller. With longer rows: each row in
    pieces, its RMS (a number) summed over them first."""
    n = ys.numel()
    if not row:
        for start in range(0, n, chunk):
            yield start, min(n, start + chunk), None
        return
    if row <= chunk:
        step = (chunk // row) * row
        for start in range(0, n, step):
            yield start, min(n, start + step), None
        return
    for start in range(0, n, row):
        total = 0.0
        for lo in range(start, start + row, chunk):
            y = ys[lo : min(start + row, lo + chunk)].to(torch.float64)
            total += float(torch.where(torch.isfinite(y), y, 0.0).pow(2).sum().item())
        rms = math.sqrt(total / row)
        for lo in range(start, start + row, chunk):
            yield lo, min(start + row, lo + chunk), rms


def all_within(
    out: torch.Tensor,
    ref: torch.Tensor,
    atol: float,
    rtol: float,
    row_scaled: bool,
    error_cap: float | None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> bool:
    """True when every element of ``out`` is finite and within its allowance of a finite
    reference element (``scan_floats``'s rule, in the same float64), and none is off by more
    than ``error_cap``: such an output passes. False says only that the full scan must decide
    (a matching NaN or infinity, or a miss the matched ratio may let through). A handful of
    operations per chunk where the scan takes a few dozen: a check of many outputs asks this
    first. A NaN anywhere compares False, and so does an infinite output where the reference
    is finite; an infinite reference is refused here by its finiteness."""
    for _, x, y, row_rms in _chunks(out, ref, row_scaled, chunk_elements):
        err = (x - y).abs_()
        allowed = y.abs().mul_(rtol).add_(atol)
        if row_rms is not None:
            allowed = allowed + rtol * row_rms
        within = (err <= allowed).logical_and_(torch.isfinite(y))
        if not bool(within.all().item()):
            return False
        if error_cap is not None and not bool((err <= error_cap).all().item()):
            return False
    return True


def _fold(
    scan: Scan,
    x: torch.Tensor,
    y: torch.Tensor,
    offset: int,
    atol: float,
    rtol: float,
    row_rms: float | torch.Tensor | None,
    outlier_factor: float,
) -> None:
    """One chunk's share of the statistics (torch.allclose's rule, NaN and Inf handled as
    ``compare`` documents)."""
    ref_finite = torch.isfinite(y)
    out_finite = torch.isfinite(x)
    both = ref_finite & out_finite
    same_special = (~ref_finite) & (((x == y) & torch.isinf(y)) | (torch.isnan(x) & torch.isnan(y)))
    nonfinite_bad = (~out_finite) & ref_finite
    err = torch.where(both, (x - y).abs(), 0.0)
    allowed = atol + rtol * y.abs()
    if row_rms is not None:
        allowed = allowed + rtol * row_rms
    fails = (both & (err > allowed)) | nonfinite_bad | (~ref_finite & ~same_special)
    scan.worst_abs.offer(err, offset, x, y)
    scan.max_abs = max(scan.max_abs, scan.worst_abs.value)
    rel = torch.where(ref_finite, err / torch.clamp(y.abs(), min=max(atol, 1e-30)), 0.0)
    # one transfer for the chunk's figures: each .item() waits for the device (counts are exact
    # in float64 up to 2**53 elements)
    figures = torch.stack(
        [
            rel.max().to(torch.float64),
            fails.sum().to(torch.float64),
            (torch.isnan(x) & ref_finite).sum().to(torch.float64),
            (torch.isinf(x) & ref_finite).sum().to(torch.float64),
        ]
    ).tolist()
    del rel
    scan.max_rel = max(scan.max_rel, figures[0])
    n_fail = int(figures[1])
    scan.nan += int(figures[2])
    scan.inf += int(figures[3])
    if not n_fail:
        return
    scan.mismatches += n_fail
    scan.first_fail.offer(fails, offset, x, y)
    scan.first_special.offer(nonfinite_bad | (fails & ~ref_finite), offset, x, y)
    scan.worst_fail.offer(torch.where(fails, err - allowed, -1.0), offset, x, y)
    excess = torch.where(fails, err / allowed.clamp(min=1e-300), 0.0)
    scan.outliers += int((excess > outlier_factor).sum().item())
    scan.worst_excess.offer(excess, offset, x, y)


@dataclass
class ExactScan:
    """An integer or boolean comparison: how many elements differ and the first one."""

    mismatches: int = 0
    first: First = field(default_factory=First)


def scan_exact(out: torch.Tensor, ref: torch.Tensor, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> ExactScan:
    xs, ys = flat(out), flat(ref)
    scan = ExactScan()
    step = max(1, int(chunk_elements))
    for start in range(0, xs.numel(), step):
        x, y = xs[start : start + step], ys[start : start + step]
        diff = x != y
        bad = int(diff.sum().item())
        if bad:
            scan.mismatches += bad
            scan.first.offer(diff, start, x, y)
    return scan


def all_finite(t: torch.Tensor, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> bool:
    """No NaN or Inf in ``t``, checked a chunk at a time (no full-size mask)."""
    if not (t.is_floating_point() or t.is_complex()):
        return True
    xs = flat(t)
    step = max(1, int(chunk_elements))
    return all(bool(torch.isfinite(xs[s : s + step]).all().item()) for s in range(0, xs.numel(), step))
