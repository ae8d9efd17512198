"""The candidate worker: builds one candidate, runs it on the inputs it is told to make,
hands its outputs over as files, and times it. Used for one candidate only, then discarded,
so nothing leaks from one candidate to the next. It never sees a reference output."""

from __future__ import annotations

from pathlib import Path

import torch

from ..builders import BuildError, get_builder
from ..builders.trim import trim_traceback
from . import harness, nvml
from .common import CandidateFault, load_module_from_source, normalize_outputs, storage_range
from .harness import T
from .inputs import InputMaker, torch_dtype
from .tensorio import write_tensor
from .timing import Timer

POISON_BYTE = 0xFF  # 0xFFFF... is NaN in every float format


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (0-d included), for bitwise comparison."""
    flat = T.view(T.contiguous(t), (-1,))
    return flat if flat.dtype == torch.bool else T.view(flat, torch.uint8)


class CandidateRole:
    def __init__(self, device: str, workdir: Path):
        self.device = device
        self.workdir = workdir
        self.srcdir = workdir / "src"
        self.fn = None
        self.dps = False
        self.d: dict = {}
        self.maker: InputMaker | None = None
        self.timer: Timer | None = None
        self.cuda = device.startswith("cuda")

    # -- ops ----------------------------------------------------------------------------
    def handle(self, msg: dict) -> dict:
        op = msg.get("op")
        try:
            if op == "prepare":
                return self.prepare(msg)
            if op == "check":
                return self.check(msg)
            if op == "time":
                return self.time(msg)
        except CandidateFault as f:
            return {"ok": False, "status": f.status, "message": f.message, "fatal": f.fatal}
        return {"ok": False, "status": "RUNTIME_ERROR", "message": f"unknown op {op!r}"}

    def prepare(self, msg: dict) -> dict:
        self.d = msg["definition"]
        solution = msg["solution"]
        self.dps = bool(solution["spec"].get("destination_passing_style", False))
        language = msg["language"]
        # The reference module is loaded only when inputs are custom (generate_inputs).
        module = None
        if self.d.get("custom_inputs_entrypoint"):
            module = load_module_from_source(self.d["reference"], self.workdir / "ref", "reference")
        self.maker = InputMaker(self.d, self.device, module, msg.get("blob_root"))
        t0 = T.perf_counter()
        try:
            builddir = Path(msg.get("build_cache") or self.workdir / "build")
            self.fn = get_builder(language).build(solution, self.srcdir, builddir, self.device)
        except BuildError as exc:
            return {"ok": False, "status": exc.status, "message": str(exc)}
        return {"ok": True, "build_s": T.perf_counter() - t0}

    # -- one call, with every runtime defence around it --------------------------------------
    def _alloc_outputs(self, axes: dict) -> list[torch.Tensor]:
        outs = []
        for spec in self.d["outputs"].values():
            shape = tuple(axes[x] if isinstance(x, str) else int(x) for x in (spec.get("shape") or []))
            t = T.empty(shape, dtype=torch_dtype(spec["dtype"]), device=self.device)
            if t.dtype == torch.bool:
                T.fill_(t, True)
            elif t.numel():
                T.fill_(T.view(T.view(t, (-1,)), torch.uint8), POISON_BYTE)
            outs.append(t)
        return outs

    def _poison_allocator(self, approx_bytes: int) -> None:
        """Leave NaN bytes in the caching allocator's free blocks, so output memory a
        candidate allocates but never writes reads as NaN, not as stale data."""
        if not self.cuda:
            return
        n = max(1 << 20, 2 * approx_bytes)
        junk = T.empty(n, dtype=torch.uint8, device=self.device)
        T.fill_(junk, POISON_BYTE)
        del junk

    def _call(self, args: list, axes: dict) -> list[torch.Tensor]:
        names = list(self.d["outputs"])
        dps_outs = self._alloc_outputs(axes) if self.dps else []
        clones = [T.clone(a) if T.isinstance(a, T.tensor_type) else a for a in args]
        self._poison_allocator(sum(a.nbytes for a in args if T.isinstance(a, T.tensor_type)))
        threads = harness.thread_count()
        try:
            result = self.fn(*args, *dps_outs)
            if self.cuda:
                T.cuda_sync()
        except BaseException as exc:  # noqa: BLE001 - every failure is a verdict
            raise self._fault(exc) from None
        broken = harness.violations()
        if harness.thread_count() != threads:
            broken.append(
                f"the candidate left {harness.thread_count() - threads} extra thread(s) running"
            )
        if broken:
            raise CandidateFault("REWARD_HACK", "; ".join(broken))
        outs = dps_outs if self.dps else normalize_outputs(result, names)
        in_ranges = [
            (n, storage_range(a))
            for n, a in zip(self.d["inputs"], args)
            if T.isinstance(a, T.tensor_type) and a.numel()
        ]
        seen_out = []
        for name, t in zip(names, outs):
            if T.type(t) is not T.tensor_type:
                raise CandidateFault(
                    "REWARD_HACK",
                    f"output {name!r} is a {T.type(t).__name__}, not a plain torch.Tensor",
                )
            if t.device != torch.device(self.device) and not (
                self.cuda and t.device.type == "cuda"
            ):
                raise CandidateFault(
                    "RUNTIME_ERROR", f"output {name!r} is on {t.device}, expected {self.device}"
                )
            if t.numel() and not self.dps:
                lo, hi = storage_range(t)
                for iname, (ilo, ihi) in in_ranges:
                    if lo < ihi and ilo < hi:
                        raise CandidateFault(
                            "REWARD_HACK",
                            f"output {name!r} shares memory with input {iname!r}; return a new tensor",
                        )
                for oname, (olo, ohi) in seen_out:
                    if lo < ohi and olo < hi:
                        raise CandidateFault(
                            "REWARD_HACK", f"outputs {oname!r} and {name!r} share memory"
                        )
                seen_out.append((name, (lo, hi)))
        for iname, a, c in zip(self.d["inputs"], args, clones):
            if T.isinstance(a, T.tensor_type) and not T.equal(a, c):
                raise CandidateFault(
                    "REWARD_HACK", f"input {iname!r} was modified; inputs are read-only"
                )
        return outs

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
    def check(self, msg: dict) -> dict:
        axes, workload = msg["axes"], msg["workload"]
        outdir = Path(msg["outdir"])
        rounds = []
        for i, rnd in enumerate(msg["rounds"]):
            try:
                args = self.maker.make(workload, axes, rnd["seed"], rnd["kind"])
            except Exception as exc:  # inputs are the guard's job: not the candidate's fault
                return {"ok": False, "status": "INTERNAL", "message": f"making inputs failed: {exc}"}
            outs = self._call(args, axes)
            if msg.get("determinism") and i == 0:
                again = self._call(args, axes)
                for name, a, b in zip(self.d["outputs"], outs, again):
                    if a.shape != b.shape or not T.equal(_bytes(a), _bytes(b)):
                        raise CandidateFault(
                            "INCORRECT_NUMERICAL",
                            f"output {name!r} differs between two calls on the same inputs "
                            "(non-deterministic: atomics, races or uninitialised memory?)",
                        )
                del again
            metas = [
                write_tensor(t, outdir / f"{rnd['tag']}_{k}.bin") for k, t in enumerate(outs)
            ]
            rounds.append({"tag": rnd["tag"], "outputs": metas})
            del outs, args
        return {"ok": True, "rounds": rounds}

    # -- timing ----------------------------------------------------------------------------
    def time(self, msg: dict) -> dict:
        axes, workload, cfg = msg["axes"], msg["workload"], msg["config"]
        outdir = Path(msg["outdir"])
        if self.timer is None:
            self.timer = Timer(self.device)
        sets = [self.maker.make(workload, axes, s, "normal") for s in msg["sets"]]
        outs = [self._alloc_outputs(axes) if self.dps else [] for _ in sets]
        fn = self.fn
        audits: list[dict] = []
        threads = harness.thread_count()

        def call(k: int):
            result = fn(*sets[k], *outs[k])
            # destination passing: the buffers are the outputs (a graph keeps them as its own)
            return outs[k] if self.dps else result

        def on_audit(iteration: int, k: int, result) -> None:
            got = list(result) if self.dps else normalize_outputs(result, list(self.d["outputs"]))
            metas = []
            for j, t in enumerate(got):
                if T.type(t) is not T.tensor_type:
                    raise CandidateFault("REWARD_HACK", "a timed call returned a tensor subclass")
                metas.append(write_tensor(t, outdir / f"audit{iteration}_{j}.bin"))
            audits.append({"iteration": iteration, "set": k, "outputs": metas})

        before = nvml.snapshot(msg.get("gpu_uuid")) if self.cuda else None
        try:
            stats = self.timer.measure(
                call,
                n_sets=len(sets),
                min_iters=cfg["min_iters"],
                max_iters=cfg["max_iters"],
                target_time_s=cfg["target_time_s"],
                warmup_time_s=cfg["warmup_time_s"],
                audit_at=tuple(msg.get("audit_at", ())),
                on_audit=on_audit,
                max_time_s=cfg.get("max_timing_s"),
                outputs_of=(lambda k: outs[k]) if self.dps else None,
            )
        except CandidateFault:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise self._fault(exc) from None
        after = nvml.snapshot(msg.get("gpu_uuid")) if self.cuda else None
        broken = harness.violations()
        if harness.thread_count() != threads:
            broken.append("the candidate started threads during timing")
        if broken:
            raise CandidateFault("REWARD_HACK", "; ".join(broken))
        return {"ok": True, "stats": stats, "audits": audits, "nvml": {"before": before, "after": after}}
