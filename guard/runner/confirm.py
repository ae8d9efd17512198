"""The outside clock's loop: ``Confirm`` in the candidate worker, ``Overhead`` (the same loop
without the call) and ``VerifyReplays`` in the trusted one.

The guard's clock runs around the whole request; the difference per call between the
candidate's loop and the trusted loop without the call bounds what a call costs, however the
candidate's process reports its time (``guard/outside_clock.py``). For that difference to
resolve a kernel of a few microseconds, the loop's own cost must be small and steady, and the
device, not the host, must set the pace:

- fresh inputs come from one generator seeded once per loop and drawn on in order
  (``refill.StreamRefill``); on a GPU the draws of each input set are one captured graph, so a
  refill is one launch;
- the outputs' digests (``replays.digest``) are one captured graph per set, written into row
  ``i`` of a table on the device;
- every iteration starts with memory-bound device work (``pad_passes`` passes over the flush
  buffer, the same count in both workers), long enough for the host to enqueue the rest of
  the iteration: the device never waits for the host, so an eager call's
  launch latency stays out of the difference as it stays out of its CUPTI span.

A captured call (the timed loop's own graph) is replayed as it is; an eager call's outputs are
copied into the static buffers that the digest graph reads, and the trusted loop copies as many
bytes. Inputs that a custom generator makes cannot be drawn in a graph: they are remade per call
from the call's own seed (``Refiller``), eagerly, and the loop is host-bound; the guard
then applies the wider band.

On a CPU the loop does nothing but the calls, one at a time: each call's inputs are a set of its
own that the guard writes once the call before it is done (``staged.StagedInputs``, drawn by
the trusted worker, so no draw is in the window; ``pacing``: after each call the loop says
where its outputs lie and waits), each call's outputs are held where the call left them
(``kept.KeptOutputs``) and the guard reads the ones it checks out of the worker's memory
itself (``peek``) right then; the trusted loop, paced alike, places the sets alone. Nothing is
left in the candidate's process for it to do more cheaply than the trusted worker does.
"""

from __future__ import annotations

import functools
import gc
import math
import struct
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import replays
from .harness import T
from .kept import KeptOutputs
from .pacing import Pacing
from .refill import Refiller, StreamRefill
from .staged import StagedInputs

# ``call(set)``: runs the candidate's call on the live set ``set``; returns the output tensors
# to copy into the static buffers, or None when the call wrote them there itself
LoopCall = Callable[[int], "list[torch.Tensor] | None"]
Sets = list[list[Any]]  # per input set, the call's arguments (tensors and scalars)


# warm runs of the outside clock's loop, after a first one, that measure its host time at arm
WARM_HOST_RUNS = 2


class ConfirmLoop:
    """The loop over the live input ``sets`` (refilled in place) whose outputs are read from
    ``static`` (per set, the tensors the digest reads; None: inputs only, for checking).
    ``mirror`` (trusted loop only): per set, tensors copied into ``static`` every iteration,
    as the candidate's loop copies an eager call's outputs."""

    def __init__(
        self,
        device: torch.device | str,
        sets: Sets,
        refiller: Refiller,
        static: list[list[torch.Tensor]] | None,
        rows: int,
        idle: Callable[[int], None],
        mirror: list[list[torch.Tensor]] | None = None,
        projection_seed: int = 0,
        kept: KeptOutputs | None = None,
        staged: StagedInputs | None = None,
        pacing: Pacing | None = None,
    ):
        """A CPU's loop (``static`` None): ``staged``, each call's inputs, ``kept`` (the
        candidate's loop), where the calls' outputs are held, and ``pacing``, the handshake
        with the guard after each call (``runner/pacing.py``; None: unpaced, for tests of the
        loop alone). Without ``kept`` the loop places the staged sets alone (a CPU's trusted
        loop)."""
        self.device = torch.device(device)
        self.kept, self.staged, self.pacing = kept, staged, pacing
        self.paced_now = False
        self.sets, self.refiller, self.static, self.mirror = sets, refiller, static, mirror
        self.rows, self.idle = max(1, rows), idle
        # a CPU's loop draws nothing (the trusted worker draws each window's inputs for the guard
        # to write): its calls' inputs come from their own seeds, so a check redraws only the
        # calls it checks, not every call before them in one stream
        self.regime = "seeded" if refiller.custom or self.device.type != "cuda" else "stream"
        self.stream = StreamRefill(refiller.draws, self.device)
        # the projection signs are drawn here, before any window: drawing a million of them is
        # milliseconds of fixed cost that a window must not hold (a candidate could do it faster)
        self.projection = replays.Projection(projection_seed, calls=self.rows)
        self.projection.weights(self.device)  # made before capture
        cuda = self.device.type == "cuda"
        # the draws of a set are one graph only when the guard draws them itself; the digests
        # always are on a GPU (the buffers they read are the same every call)
        self.graph_refill = cuda and self.regime == "stream"
        self.refill_graphs: list[Any] = []
        self.host_ms_per_iter = 0.0
        self._spare_outputs: list[list[torch.Tensor]] | None = None
        pool = torch.cuda.graph_pool_handle() if cuda else None
        if self.graph_refill:
            self._capture_refills(pool)
        self.digests = (
            replays.DigestTable(self.device, static, self.rows, self.projection, graphs=cuda, pool=pool)
            if static is not None
            else None
        )

    # -- the steps ---------------------------------------------------------------------------
    def _draw(self, k: int) -> None:
        self.stream(self.sets[k])

    def _outputs(self, k: int) -> list[torch.Tensor]:
        if self.static is None:
            raise RuntimeError("this loop reads no outputs (it replays draws only)")
        return self.static[k]

    def _refill(self, k: int, seed: int, it: int) -> None:
        if self.regime == "seeded":
            self.refiller(self.sets[k], replays.replay_seed(seed, it))
        elif self.graph_refill:
            T.graph_replay(self.refill_graphs[k])
        else:
            self._draw(k)

    def _digest_step(self, k: int) -> None:
        if self.digests is None:
            raise RuntimeError("this loop reads no outputs (it replays draws only)")
        self.digests.step(k)

    def _capture_refills(self, pool: Any) -> None:
        """One graph of the draws per set (the generator registered with it), after a warm-up
        on a side stream, as for any capture; each replayed once, so no upload is in a window."""
        n = len(self.sets)
        self.stream.seed(0)
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for k in range(n):
                self._draw(k)
        torch.cuda.current_stream(self.device).wait_stream(side)
        T.cuda_sync()
        for k in range(n):
            g = torch.cuda.CUDAGraph()
            g.register_generator_state(self.stream.gen)
            with torch.cuda.graph(g, pool=pool):
                self._draw(k)
            self.refill_graphs.append(g)
        for g in self.refill_graphs:
            T.graph_replay(g)
        T.cuda_sync()

    # -- the loop ----------------------------------------------------------------------------
    def run(
        self, seed: int, iters: int, call: LoopCall | None, pad_passes: int, copies: bool = False, paced: bool = False
    ) -> list[Any]:
        """``iters`` iterations on the data of ``seed``: ``pad_passes`` flush passes, fresh inputs, the call (None: the
        trusted loop, which copies ``mirror`` instead), digest. ``copies``: the trusted loop is
        charged for copying the outputs, so a call that returns none (a graph, destination
        passing) copies as many bytes too; a candidate that reported eager timing for a
        captured call gains nothing from it. The digests, per iteration and output, as lists
        of floats. ``host_ms_per_iter`` is the host's time to enqueue one. ``paced`` (a CPU): each
        call after the first waits for the guard's GO (``pacing``; ``self.paced_now`` while it runs)."""
        if not 0 < iters <= self.rows:
            raise ValueError(f"{iters} iterations asked of a loop made for at most {self.rows}")
        self.stream.seed(seed)
        if self.digests is not None:
            self.digests.reset()
        if self.kept is not None:
            self.kept.reset()
        if self.staged is not None:
            self.staged.ensure(iters)
        self.paced_now = paced
        self._sync()
        n = len(self.sets)
        collecting = gc.isenabled()
        gc.disable()  # a collection's pause in a window is noise the guard's clock would see
        t0 = T.perf_counter()
        try:
            if self.digests is not None:
                self._loop(seed, iters, call, pad_passes, n, copies)
            else:  # a CPU's: the staged inputs placed, and the calls' outputs held (``kept``)
                self._held_loop(iters, call, pad_passes, n)
            self.host_ms_per_iter = (T.perf_counter() - t0) * 1e3 / iters
            self._sync()
        finally:
            if self.kept is not None:
                self.kept.finish()
            if self.staged is not None:
                self.staged.finish()
            if collecting:
                gc.enable()
        return self.digests.read(iters) if self.digests is not None else []

    def warm_host_ms(self, seed: int, iters: int, call: LoopCall | None, runs: int = WARM_HOST_RUNS) -> float:
        """The host's time to enqueue one iteration, as the windows' warm loops take it: the
        least of ``runs`` runs of ``iters`` after a first that is not counted. The guard sets
        the padding by this figure, capped, and a loop the cap leaves host-bound has its
        outside figure, host time, floor the call's device time. Until session 51 it was one
        run of 10 iterations, the loop's first, in which every graph of the loop is launched
        for the first time; floors came and went between resubmissions of one kernel
        (rmsnorm_h4096 on an H100: 0.0023 ms floored to 0.0288 ms in 5 of 19, each then a
        pairing of about 25 s). That the cold run was their cause is a likely reading, not
        yet measured: the windows themselves are warm, and the shortest is taken."""
        self.run(seed, iters, call, 0)
        least = math.inf
        for _ in range(runs):
            self.run(seed, iters, call, 0)
            least = min(least, self.host_ms_per_iter)
        self.host_ms_per_iter = least
        return least

    def _loop(
        self, seed: int, iters: int, call: LoopCall | None, pad_passes: int, n: int, copies: bool = False
    ) -> None:
        for it in range(iters):
            k = it % n
            self.idle(pad_passes)
            self._refill(k, seed, it)
            got = call(k) if call is not None else None
            if got is not None:
                for dst, src in zip(self._outputs(k), got):
                    T.copy_(dst, src)
            elif call is None and self.mirror is not None:
                for dst, src in zip(self._outputs(k), self.mirror[k]):
                    T.copy_(dst, src)
            elif copies and call is not None:
                for dst, src in zip(self._spare()[k], self._outputs(k)):
                    T.copy_(dst, src)
            self._digest_step(k)

    def _held_loop(self, iters: int, call: LoopCall | None, pad_passes: int, n: int) -> None:
        """A CPU's loop: each call's staged inputs placed, and the call with its outputs held
        (none without a call), each call's DONE sent. The guard wrote the inputs (``staged``):
        all before the window, or, paced, each once the call before it was done.

        Lean on purpose: what this loop does besides the call is the candidate's cost in its
        window and the trusted loop's in its own, and a candidate can replace it with a leaner
        one (it runs in the candidate's process). Whatever the honest loop does more than the
        leanest one such a candidate could write shortens that candidate's figure against an
        honest kernel's (red team, session 51: a leaner loop was floored about 0.8x below the
        honest kernel's figure). So each call does only what must be: wait for GO (paced),
        place its inputs, call, hold the outputs, say where they lie."""
        kept, staged, pacing = self.kept, self.staged, self.pacing
        if call is not None and kept is None:
            raise RuntimeError("a loop of calls needs their outputs' digests or somewhere to hold them")
        if staged is None:
            raise RuntimeError("a CPU's loop needs its calls' inputs staged")
        if pad_passes:
            raise RuntimeError("a CPU's loop has no padding")
        sets, rows = staged.sets, staged.rows
        calling = call if kept is not None else None
        # destination passing: each call's own buffers set first (``KeptOutputs.before``)
        before = kept.before if calling is not None and kept is not None and kept.static is not None else None
        pacer = pacing.pacer if pacing is not None else None
        go = pacer.go if pacer is not None and self.paced_now else None
        packer = payload_packer(tuple(pacing.ndims)) if pacing is not None else None
        shown = pacing.stand_ins if pacing is not None else []
        for it in range(iters):
            k = it % n
            if it and go is not None:
                go()  # the guard has written this call's inputs
            sets[k][:] = rows[it]  # ``StagedInputs.place``
            if calling is not None and kept is not None:
                if before is not None:
                    before(it, k)
                kept.take(it, calling(k))
                shown = kept.held[it]
            if pacer is not None and packer is not None:
                pacer.done(packer(shown))

    def _spare(self) -> list[list[torch.Tensor]]:
        """Buffers of the outputs' sizes, made once, for the copies a call without outputs of
        its own is charged (``run``'s ``copies``)."""
        if self._spare_outputs is None:
            self._spare_outputs = [[T.clone(t) for t in self._outputs(k)] for k in range(len(self.sets))]
        return self._spare_outputs

    def inputs_at(self, seed: int, iterations: list[int]) -> Iterator[tuple[int, list[Any]]]:
        """The live set of each of ``iterations`` (ascending), as the loop of ``seed`` had it:
        the same draws from the same seed, in the same order, without the calls."""
        wanted = set(iterations)
        if self.regime == "seeded":  # each call's inputs from its own seed: only those asked for
            for it in sorted(wanted):
                k = it % len(self.sets)
                self._refill(k, seed, it)
                self._sync()
                yield it, self.sets[k]
            return
        self.stream.seed(seed)
        for it in range(max(iterations, default=-1) + 1):
            k = it % len(self.sets)
            self._refill(k, seed, it)
            if it in wanted:
                self._sync()
                yield it, self.sets[k]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            T.cuda_sync()


def pack_outputs(outputs: list[Any], ndims: list[int]) -> bytes:
    """A DONE payload (``runner/pacing.py``): where each output of one call lies (the
    definition's outputs, ``ndims`` dimensions each), its address and strides in elements;
    zeros for one that is not a CPU tensor of that rank (the guard finds nothing there)."""
    return payload_packer(tuple(ndims))(outputs)


@functools.lru_cache(maxsize=64)
def payload_packer(ndims: tuple[int, ...]) -> Callable[[list[Any]], bytes]:
    """``pack_outputs`` for outputs of ``ndims`` dimensions, its format made once."""
    fmt = struct.Struct(f"<{sum(1 + nd for nd in ndims)}q").pack
    tensor_type, type_of = T.tensor_type, T.type

    def pack(outputs: list[Any]) -> bytes:
        values: list[int] = []
        for j, nd in enumerate(ndims):
            t: Any = outputs[j] if j < len(outputs) else None
            # exact tensors only (a subclass would run the candidate's code here); ``is_cpu``
            # is read off the tensor, where ``device.type`` makes an object each call
            if type_of(t) is tensor_type and t.is_cpu and t.dim() == nd:
                values.append(T.data_ptr(t))
                values.extend(t.stride())
            else:
                values.extend([0] * (1 + nd))
        return fmt(*values)

    return pack
