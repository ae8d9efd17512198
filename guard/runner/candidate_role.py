"""The candidate worker: builds one candidate, runs it on the inputs it is told to make,
hands its outputs over as files, and times it. Used for one candidate only, then discarded,
so nothing leaks from one candidate to the next. It never sees a reference output."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..builders import BuildError, get_builder
from ..builders.trim import trim_traceback
from . import harness, repeat_mark, replays, reuse
from . import messages as m
from .confirm import ConfirmLoop
from .common import (
    CandidateFault,
    load_module_from_source,
    normalize_outputs,
    PeakMeter,
    prefault_host_heap,
    release_device_cache,
    storage_range,
    trim_host_heap,
)
from .harness import T
from .inputs import InputMaker, spec_shape, torch_dtype
from .kept import KeptOutputs
from .pacing import Pacer, Pacing
from .poison import poison_free_blocks, poison_in_place, poison_tensor
from .refill import Refiller
from .compare import compare, spec_args
from .snapshots import close, same_bytes, snapshots
from .staged import StagedInputs
from .tensorio import write_tensor
from .timing import PendingStats, Plan, Timer

# a correctness round whose outputs reach this size gives the allocator's cache back after it
LARGE_ROUND_BYTES = 256 << 20


class CandidateRole:
    def __init__(self, device: str, workdir: Path, meter: PeakMeter | None = None, pacer: Pacer | None = None):
        """``pacer``: the handshake with the guard on the worker's socket that a CPU's
        outside-clock loop makes after each call (None: unpaced, for tests of the role alone)."""
        self.device = device
        self.pacer = pacer
        self.meter = meter or PeakMeter(device)  # the worker's loop measures each request
        self.workdir = workdir
        self.srcdir = workdir / "src"
        self.fn = None
        self.dps = False
        self.d: dict = {}
        self.maker: InputMaker | None = None
        self.timer: Timer | None = None
        self.cuda = device.startswith("cuda")
        # the live input sets and destination buffers of the workload being timed
        self.sets: list[list] = []
        self.outs: list[list] = []
        self.workload: dict = {}
        self.axes: dict = {}
        self.plan: Plan | None = None
        self.refiller: Refiller | None = None
        self.confirm_loop: ConfirmLoop | None = None
        self._confirm_rows = 0
        self._confirm_least = 0
        # a CPU: each call's outputs, held for the guard to read: the timed loop's (copies) until
        # ``stats``, then the outside clock's loop's, where the calls left them (``kept``)
        self.kept: KeptOutputs | None = None
        self._own_pid = os.getpid()  # before candidate code; the guard keeps what set-up says of it
        self._pending: PendingStats | None = None  # the last timed loop's, until ``stats`` reads it
        self.threads = harness.thread_count()

    # -- ops ----------------------------------------------------------------------------
    def handle(self, raw: dict) -> dict:
        try:
            msg = m.parse_candidate_request(raw)
        except m.MessageError as exc:
            return m.Reply(ok=False, status="INTERNAL", message=str(exc)).model_dump()
        handler = {
            m.Setup: self.setup,
            m.Prepare: self.prepare,
            m.Check: self.check,
            m.Arm: self.arm,
            m.Run: self.run,
            m.StageInputs: self.stage_inputs,
            m.Confirm: self.confirm,
            m.Stats: self.stats,
            m.Memory: self.memory,
        }[type(msg)]
        if self._pending is not None and not isinstance(msg, (m.Stats, m.Memory)):
            # the guard went on without reading the last loop: its profiler stops before any other work
            self._pending.drop()
            self._pending = None
        try:
            reply = handler(msg)
        except CandidateFault as f:
            reply = m.Reply(ok=False, status=f.status, message=f.message, fatal=f.fatal)
        return reply.model_dump()

    def setup(self, msg: m.Setup) -> m.Reply:
        """The problem's definition and input maker; nothing of the candidate's runs yet."""
        self.d = msg.definition
        if msg.settle_dynamo and not self.cuda:
            harness.settle_dynamo()  # before any code of the candidate or the reference runs
        # The reference module is loaded only when inputs are custom (generate_inputs).
        module = None
        if self.d.get("custom_inputs_entrypoint"):
            module = load_module_from_source(self.d["reference"], self.workdir / "ref", "reference")
        self.maker = InputMaker(self.d, self.device, module, msg.blob_root)
        return m.SetupReply(ok=True, pid=self._own_pid)

    def prepare(self, msg: m.Prepare) -> m.Reply:
        if not self.d:
            return m.Reply(ok=False, status="INTERNAL", message="prepare before setup")
        solution = msg.solution
        self.dps = bool(solution["spec"].get("destination_passing_style", False))
        t0 = T.perf_counter()
        try:
            builddir = Path(msg.build_cache or self.workdir / "build")
            self.fn = get_builder(msg.language).build(solution, self.srcdir, builddir, self.device)
        except BuildError as exc:
            return m.Reply(ok=False, status=exc.status, message=str(exc))
        # the thread count stays the one taken before the candidate's code was imported: a
        # thread its import started is as foreign as one a call started
        return m.PrepareReply(ok=True, build_s=T.perf_counter() - t0)

    # -- one call, with every runtime defence around it --------------------------------------
    def _alloc_outputs(self, axes: dict) -> list[torch.Tensor]:
        outs = []
        for spec in self.d["outputs"].values():
            t = T.empty(spec_shape(spec, axes), dtype=torch_dtype(spec["dtype"]), device=self.device)
            poison_tensor(t)
            outs.append(t)
        return outs

    def _call(self, args: list, axes: dict, call_bytes: int) -> list[torch.Tensor]:
        """One checked call; ``call_bytes`` (the request's) sizes the room its copies need."""
        names = list(self.d["outputs"])
        dps_outs = self._alloc_outputs(axes) if self.dps else []
        with self._after_candidate_code("before its call"):
            before = snapshots(args, call_bytes)
            poison_free_blocks(torch.device(self.device))
        threads = harness.thread_count()
        try:
            result = self.fn(*args, *dps_outs)
            if self.cuda:
                T.cuda_sync()
        except BaseException as exc:  # noqa: BLE001 - every failure is a verdict
            raise self._fault(exc) from None
        broken = harness.violations()
        if harness.thread_count() != threads:
            broken.append(f"the candidate left {harness.thread_count() - threads} extra thread(s) running")
        if broken:
            raise CandidateFault("REWARD_HACK", "; ".join(broken))
        outs = dps_outs if self.dps else normalize_outputs(result, names)
        in_ranges = [
            (n, storage_range(a))
            for n, a in zip(self.d["inputs"], args)
            if T.isinstance(a, T.tensor_type) and a.numel()
        ]
        seen_out: list[tuple[str, reuse.Layout]] = []
        for name, t in zip(names, outs):
            if T.type(t) is not T.tensor_type:
                raise CandidateFault(
                    "REWARD_HACK",
                    f"output {name!r} is a {T.type(t).__name__}, not a plain torch.Tensor",
                )
            if t.device != torch.device(self.device) and not (self.cuda and t.device.type == "cuda"):
                raise CandidateFault("RUNTIME_ERROR", f"output {name!r} is on {t.device}, expected {self.device}")
            if t.numel() and not self.dps:
                lo, hi = storage_range(t)
                for iname, (ilo, ihi) in in_ranges:
                    if lo < ihi and ilo < hi:
                        raise CandidateFault(
                            "REWARD_HACK",
                            f"output {name!r} shares memory with input {iname!r}; return a new tensor",
                        )
                # by elements, not storages: two column blocks of one buffer are two outputs
                for oname, other in seen_out:
                    if reuse.share_elements(_layout(t), other):
                        raise CandidateFault("REWARD_HACK", f"outputs {oname!r} and {name!r} share memory")
                seen_out.append((name, _layout(t)))
        for iname, a, c in zip(self.d["inputs"], args, before):
            if T.isinstance(a, T.tensor_type) and not same_bytes(a, c):
                raise CandidateFault("REWARD_HACK", f"input {iname!r} was modified; inputs are read-only")
        return outs

    @contextmanager
    def _after_candidate_code(self, when: str) -> Iterator[None]:
        """The worker's own steps around a checked call, in a process where candidate code
        has run: what fails there (a snapshot the candidate's allocator corrupted, memory it
        exhausted) is the candidate's doing, never the guard's INTERNAL error, whose text
        would reach the agent and could carry what it learnt of the held-out inputs."""
        try:
            yield
        except CandidateFault:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure is a verdict
            raise CandidateFault(
                "RUNTIME_ERROR",
                f"the worker's own step {when} failed in the candidate's process ({type(exc).__name__})",
                fatal=self.cuda,
            ) from None

    def _fault(self, exc: BaseException) -> CandidateFault:
        text = trim_traceback(exc, [self.srcdir])
        kind = type(exc)
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return CandidateFault("RUNTIME_ERROR", "the candidate tried to exit the process")
        if "triton" in kind.__module__ and "Compil" in kind.__name__:
            return CandidateFault("COMPILE_ERROR", "Triton compilation failed:\n" + text)
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
            return CandidateFault("RUNTIME_ERROR", "out of memory:\n" + text, fatal=self.cuda)
        fatal = self.cuda and ("CUDA error" in str(exc) or "illegal" in str(exc).lower())
        return CandidateFault("RUNTIME_ERROR", text, fatal=fatal)

    # -- correctness ----------------------------------------------------------------------
    def check(self, msg: m.Check) -> m.Reply:
        outdir = Path(msg.outdir)
        axes, workload = msg.axes, msg.workload
        rounds = []
        # a CPU: the outputs of every earlier round of this check (as many as the trusted
        # worker holds references for, ``correctness_gate.batches``), held until its last call
        # has returned
        earlier: list = []
        for i, rnd in enumerate(msg.rounds):
            try:
                args = self.maker.make(workload, axes, rnd.seed, rnd.kind)
            except Exception as exc:  # inputs are the guard's job: not the candidate's fault
                # but its process: the type only, never text the candidate's code may have set
                return m.Reply(ok=False, status="INTERNAL", message=f"making inputs failed ({type(exc).__name__})")
            call_bytes = msg.call_bytes
            outs = self._call(args, axes, call_bytes)
            if earlier:
                with self._after_candidate_code("after its call"):
                    why = _returned_again(list(self.d["outputs"]), outs, earlier)
                if why:
                    raise CandidateFault("INCORRECT_NUMERICAL", why)
            if msg.repeat is not None and i == 0:
                # the first call's outputs kept as copies (``snapshots``: on the host without room), so the
                # second call reuses their device memory instead of adding its own
                with self._after_candidate_code("after its call"):
                    first = snapshots(outs, call_bytes)
                    marked = repeat_mark.first_outputs(outs)
                try:
                    with self._after_candidate_code("after its call"):
                        repeat_mark.mark_in_place(outs)
                    del outs  # the guard's last reference: what still holds them is the candidate's
                    outs = self._call(args, axes, call_bytes)
                    with self._after_candidate_code("comparing its two calls"):
                        if kept := repeat_mark.kept_from_first_call(list(self.d["outputs"]), outs, marked):
                            raise CandidateFault("REWARD_HACK", kept)
                        why = _repeat_differs(list(self.d["outputs"]), outs, first, msg.repeat.within)
                finally:
                    repeat_mark.release(marked)
                if why:
                    raise CandidateFault("INCORRECT_NUMERICAL", why)
                del first
            metas = [write_tensor(t, outdir / f"{rnd.tag}_{k}.bin") for k, t in enumerate(outs)]
            rounds.append(m.CheckedRound(tag=rnd.tag, outputs=metas))
            with self._after_candidate_code("after its call"):
                poison_in_place(outs)
                if not self.cuda and not self.dps:  # destination buffers are the guard's own
                    earlier += outs
                del outs, args  # nothing else of a round outlives it
                if not self.cuda:
                    trim_host_heap()  # and the resident set, the CPU's memory figure, shows it
                elif call_bytes >= LARGE_ROUND_BYTES:
                    # rounds of other kinds allocate other temporaries: cached blocks of one round
                    # would stay held beside the next's (38 GiB for ReLU's 12 GiB call was seen);
                    # inputs count as outputs do (a reduction's 8 GiB input and its copy on the
                    # device, else cached into the timing that follows);
                    # poisoned first: the driver may hand the same pages back to this process
                    poison_free_blocks(torch.device(self.device))
                    release_device_cache()
        if earlier:  # the rounds' outputs too, before the reply
            del earlier
            trim_host_heap()
        return m.CheckReply(ok=True, rounds=rounds)

    # -- timing ----------------------------------------------------------------------------
    def _timing_call(self):
        fn = self.fn

        def call(k: int):
            result = fn(*self.sets[k], *self.outs[k])
            # destination passing: the buffers are the outputs (a graph keeps them as its own)
            return self.outs[k] if self.dps else result

        return call

    def _outputs(self, result) -> list:
        return list(result) if self.dps else normalize_outputs(result, list(self.d["outputs"]))

    def arm(self, msg: m.Arm) -> m.Reply:
        """Make the live input sets, warm up, capture, plan (``Timer.arm``). Warm-up data
        comes from ``arm_seed``; the timed calls' data only from the run's own seed."""
        # the last workload's held outputs and outside-clock loop go before this one's are made
        self.kept = self.confirm_loop = None
        self.workload, self.axes = msg.workload, msg.axes
        cfg, arm_seed = msg.config, msg.arm_seed
        self._confirm_projection_seed = msg.confirm_projection_seed
        self._confirm_rows = msg.confirm_rows
        self._confirm_least = msg.confirm_least
        tolerances = [t.model_dump() for t in msg.tolerances]
        if self.timer is None:
            self.timer = Timer(self.device)
        self.sets = [self.maker.make(self.workload, self.axes, s, "normal") for s in msg.sets]
        self.outs = [self._alloc_outputs(self.axes) if self.dps else [] for _ in self.sets]
        call = self._timing_call()
        gen = torch.Generator(device=self.device).manual_seed(replays.sub_seed(arm_seed, "scramble"))
        self.refiller = Refiller(self.maker, self.workload, self.axes)
        call_bytes = msg.call_bytes

        def refill(k: int, index: int) -> None:
            self.refiller(self.sets[k], replays.sub_seed(arm_seed, index))

        def graph_holds(k: int, static_outputs, replay) -> str | None:
            refill(k, -10_000 - k)
            # a copy of the eager result (``snapshots``), the call's own dropped
            eager = snapshots(replays.tensors_of(self._outputs(call(k))), call_bytes)
            replays.scramble(static_outputs, gen)
            replay()
            T.cuda_sync()
            return _same_results(eager, replays.tensors_of(self._outputs(static_outputs)), tolerances)

        try:
            self.plan = self.timer.arm(
                call,
                len(self.sets),
                refill,
                cfg.min_iters,
                cfg.max_iters,
                cfg.target_time_s,
                cfg.warmup_time_s,
                use_graphs=cfg.use_graphs,
                graph_holds=graph_holds,
            )
        except CandidateFault:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise self._fault(exc) from None
        try:
            if not self.cuda:
                self.kept = self._held_outputs()
            self.confirm_loop = self._confirm_loop()
            if self.cuda:  # the host's time to enqueue one iteration, from which the guard sets the padding
                self.confirm_loop.warm_host_ms(
                    replays.sub_seed(arm_seed, "confirm"), min(10, self.confirm_loop.rows), self._loop_call()
                )
        except CandidateFault:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise self._fault(exc) from None
        self._check_integrity("warm-up")
        return m.ArmReply(
            ok=True,
            plan=m.Plan(**self.plan.public()),
            graph_error=self.plan.graph_error,
            confirm_host_ms=self.confirm_loop.host_ms_per_iter,
            flush_ms=self.timer.flush_ms,
        )

    def _confirm_loop(self) -> ConfirmLoop:
        """The outside clock's loop over the live sets: a captured call's outputs are its
        graph's static outputs, destination-passing buffers are the call's own, and an eager
        call's outputs are copied into buffers of the definition's shapes."""
        rows = self._confirm_rows_now()
        if not self.cuda:  # held where the calls leave them (``kept``), a destination set per call
            staged = StagedInputs(self.sets, own=True)
            ndims = [len(spec_shape(spec, self.axes)) for spec in self.d["outputs"].values()]
            return ConfirmLoop(
                self.device,
                self.sets,
                self.refiller,
                None,
                rows,
                self.timer.idle_passes,
                kept=self.kept,
                staged=staged,
                pacing=Pacing(self.pacer, ndims) if self.pacer is not None else None,
            )
        if self.plan.method == "cuda-graph":
            static = [replays.tensors_of(self._outputs(out)) for _, out in self.plan.graphs]
        elif self.dps:
            static = self.outs
        else:
            static = [self._alloc_outputs(self.axes) for _ in self.sets]
        return ConfirmLoop(
            self.device,
            self.sets,
            self.refiller,
            static,
            rows,
            self.timer.idle_passes,
            projection_seed=self._confirm_projection_seed,
        )

    def _confirm_rows_now(self) -> int:
        """The most calls of one outside-clock loop: the guard's cap on a CPU (by the outputs'
        size), else the timed loop's count (10 at least), on a GPU at least the guard's count."""
        assert self.plan is not None
        rows = max(self.plan.iters, 10)
        if self.cuda:
            return max(rows, self._confirm_least)
        return self._confirm_rows or rows

    def _held_outputs(self) -> KeptOutputs:
        """A CPU: where every call of the timed loop and of an outside clock's loop leaves its
        outputs, as many rows as the longer of the two holds (a destination set per row)."""
        assert self.plan is not None
        rows = max(self.plan.iters, self._confirm_rows_now())
        if not self.dps:  # an eager call's outputs come from the heap: its pages touched once, here
            one = sum(t.numel() * t.element_size() for t in self._alloc_outputs(self.axes))
            prefault_host_heap(rows * one)
        return KeptOutputs(self.outs if self.dps else None, rows)

    def _loop_call(self):
        """The call as the outside clock's loop makes it (``confirm.LoopCall``)."""
        if self.plan.method == "cuda-graph":
            graphs = [g for g, _ in self.plan.graphs]

            def replay(k: int) -> None:
                T.graph_replay(graphs[k])

            return replay
        call = self._timing_call()
        if self.dps:

            def in_place(k: int) -> None:
                call(k)

            return in_place
        return lambda k: replays.tensors_of(self._outputs(call(k)))

    def run(self, msg: m.Run) -> m.Reply:
        """The timed loop of the armed workload. Nothing but the loop runs between receiving
        this request and replying: the guard's clock around it is the outside clock. A GPU's
        digests every call here; a CPU's holds a dense copy of every call's outputs (``kept``)
        and says where, for the guard to read the ones it checks while this process is stopped:
        no secret of the check is in this process (``RunReply``)."""
        if self.plan is None or (not self.cuda and self.kept is None):
            return m.Reply(ok=False, status="INTERNAL", message="run before arm")
        run_seed, kept = msg.run_seed, self.kept

        def refill(k: int, index: int) -> None:
            self.refiller(self.sets[k], replays.replay_seed(run_seed, index))
            if kept is not None:
                kept.before(index, k)  # destination passing: this call's own buffers

        if self.cuda:
            projection = replays.Projection(run_seed, calls=self.plan.iters)
            # Eager digests, never a captured one: CUPTI's spans are read off the loop's graph
            # launches, which must be the call's alone (a digest graph made every second launch
            # another: the spans were refused and the noisier events timed the call).
            digests = self._timed_loop(
                msg, refill, lambda k, it, out: replays.digest(self._outputs(out), projection, it), msg.use_cupti
            )
            return m.RunReply(ok=True, digests=digests)

        assert kept is not None

        def hold(k: int, it: int, out: Any) -> None:
            # destination passing: the call's own buffers, one set per call already
            kept.take(it, None if self.dps else self._outputs(out), copy=not self.dps)

        kept.reset()
        try:
            self._timed_loop(msg, refill, hold, use_cupti=False)
        finally:
            kept.finish()
        return m.RunReply(ok=True, held=kept.described())

    def _timed_loop(self, msg: m.Run, refill: Any, after: Any, use_cupti: bool) -> list:
        """``Timer.run`` on the run's data, each call's outputs scrambled first, ``after(set,
        iteration, outputs)`` after it: what ``after`` returned, moved to the host (a device
        error surfacing there is the candidate's, as any in the loop). Its statistics wait for
        ``stats`` (``_pending``)."""
        assert self.plan is not None
        gen = torch.Generator(device=self.device).manual_seed(replays.sub_seed(msg.run_seed, "scramble"))
        try:
            pending, kept = self.timer.run(
                self.plan,
                self._timing_call(),
                refill,
                lambda out, i: replays.scramble(out, gen),
                after,
                outputs_of=(lambda k: self.outs[k]) if self.dps else None,
                max_time_s=msg.max_timing_s,
                use_cupti=use_cupti,
            )
            # kept at once: a failure below leaves it for the next request to stop
            self._pending = pending
            return T.to(torch.stack(kept), "cpu").tolist() if kept else []
        except CandidateFault:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise self._fault(exc) from None

    def stage_inputs(self, msg: m.StageInputs) -> m.Reply:
        """A CPU: where the guard is to write the inputs of the next loop's calls."""
        loop = self.confirm_loop
        if loop is None or loop.staged is None:
            return m.Reply(ok=False, status="INTERNAL", message="inputs staged before arm, or on a GPU")
        if msg.iters > loop.rows:
            return m.Reply(ok=False, status="INTERNAL", message=f"{msg.iters} calls staged for {loop.rows} at most")
        try:
            inputs = loop.staged.describe(msg.iters)
        except CandidateFault:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise self._fault(exc) from None
        return m.StageReply(ok=True, inputs=inputs)

    def confirm(self, msg: m.Confirm) -> m.Reply:
        """The outside clock's loop (``confirm.ConfirmLoop``): nothing but padding, fresh
        inputs, calls and digests between this request and the reply."""
        if self.confirm_loop is None:
            return m.Reply(ok=False, status="INTERNAL", message="confirm before arm")
        loop = self.confirm_loop
        try:
            table = loop.run(msg.seed, msg.iters, self._loop_call(), msg.pad_passes, msg.copies, msg.paced)
        except CandidateFault:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise self._fault(exc) from None
        # a CPU: the outputs stay held until the next loop; the guard read the ones it checks
        # as each call was done (``pacing``)
        return m.ConfirmReply(ok=True, digests=table)

    def memory(self, msg: m.Memory) -> m.Reply:
        peak, by_op = self.meter.read(msg.reset)
        return m.MemoryReply(ok=True, peak_bytes=peak, by_op=by_op)

    def stats(self, msg: m.Stats) -> m.Reply:
        """The timed loop's statistics, read after the guard's clock has stopped."""
        if self._pending is None:
            return m.Reply(ok=False, status="INTERNAL", message="stats before run")
        pending, self._pending = self._pending, None
        if self.kept is not None:  # the guard has read the timed calls it checks
            self.kept.reset()
        try:
            stats = pending.read()
        except BaseException as exc:  # noqa: BLE001
            raise self._fault(exc) from None
        self._check_integrity("timing")
        return m.StatsReply(ok=True, stats=stats)

    def _check_integrity(self, phase: str) -> None:
        broken = harness.violations()
        extra = harness.thread_count() - self.threads
        if extra:
            broken.append(
                f"{extra} thread(s) of the candidate's are running beside the guard's at the end of "
                f"the {phase} (started at import or since)"
            )
        if broken:
            raise CandidateFault("REWARD_HACK", "; ".join(broken))


def _returned_again(names: list[str], outs: list, earlier: list) -> str | None:
    """Why a call's outputs lie in memory that an earlier call of the same check returned its
    outputs in, which the guard still holds (so no allocator gave it back), or None
    (``runner/reuse.py``). A caller that kept the earlier answer finds it overwritten; a CPU's
    loops, which hold every call's outputs for the guard to read, find the same (red team,
    session 48: such a kernel was REWARD_HACK in the timing; its own reason here instead,
    before any timing). Element bytes, not storages: an arena that hands out a new slice of one
    buffer to every call overwrites nothing (the second red team, session 48). Every earlier
    round of the check is held, so a kernel that alternates two buffers is named too wherever a
    check holds three rounds (until session 49 only the round before was held, and such a
    kernel was REWARD_HACK in the windows). On a GPU every call's outputs are digested or
    copied right after it, and such a kernel is timed as any other. Strided outputs too: a kept
    buffer returned as ``buf[:, :n]`` of a wider one was REWARD_HACK in the windows (red team,
    session 49)."""
    found = reuse.first_reuse([(0, [_tensor_layout(t) for t in earlier]), (1, [_tensor_layout(t) for t in outs])])
    if found is None:
        return None
    return reuse.overwritten(repr(names[found[2]]), "an earlier call")


def _tensor_layout(t: Any) -> reuse.Layout | None:
    """A tensor's layout (``_layout``); None for anything else."""
    return _layout(t) if T.type(t) is T.tensor_type else None


def _layout(t: Any) -> reuse.Layout:
    return T.data_ptr(t), list(t.shape), list(t.stride()), t.element_size()


def _repeat_differs(names: list[str], second: list, first: list, within: list[m.Tolerance] | None) -> str | None:
    """Why a second call on the same inputs does not repeat the first: bitwise, or, where the
    problem allows repeats to differ (``within``), beyond each output's tolerance."""
    for j, (name, a, b) in enumerate(zip(names, second, first)):
        if within is None:
            if not same_bytes(a, b):
                return (
                    f"output {name!r} differs between two calls on the same inputs "
                    "(non-deterministic: atomics, races or uninitialised memory?)"
                )
            continue
        tol = within[j] if j < len(within) else m.Tolerance(atol=0.0, rtol=0.0)
        # the comparison the reference's outputs get (matched ratio and error cap included),
        # the first call standing for the reference; the stated atol, not one scaled to the
        # output's size: two runs of one kernel differ by its own rounding (atomics), which
        # need not shrink with an output that cancels to near zero
        report = compare(a, b, tol.atol, tol.rtol, name=name, scale=False, **spec_args(tol.model_dump()))
        if not report["ok"]:
            return (
                f"output {name!r} differs between two calls on the same inputs by more than its "
                "tolerance (non-deterministic beyond rounding: races or uninitialised memory?): "
                + str(report.get("message", ""))
            )
    return None


def _same_results(eager: list, got: list, tolerances: list[dict]) -> str | None:
    """Whether a graph replay gave the eager call's result on the same inputs (a kernel
    launched outside the capture, on the legacy default stream say, is missing from the graph)."""
    why = (
        "a replay of the captured graph does not give the eager call's result on the same inputs "
        "(work launched outside the capture, e.g. on the legacy default stream): timed without a graph"
    )
    if len(eager) != len(got):
        return why
    for j, (a, b) in enumerate(zip(eager, got)):
        tol = tolerances[j] if j < len(tolerances) else {"atol": 0.0, "rtol": 0.0}
        if not close(b, a, tol["atol"], tol["rtol"]):
            return why
    return None
