"""The trusted worker: runs references, compares candidate outputs with them, times the
baselines and measures device ceilings. No candidate code is ever loaded here, so the
reference outputs it holds cannot be reached by a candidate."""

from __future__ import annotations

import traceback
from pathlib import Path

import torch

from . import ceilings
from .common import load_module_from_source, normalize_outputs
from .compare import compare
from .harness import T
from .inputs import InputMaker
from .tensorio import read_tensor
from .timing import Timer


class TrustedRole:
    def __init__(self, device: str, workdir: Path):
        self.device = device
        self.workdir = workdir
        self.cuda = device.startswith("cuda")
        self.problems: dict[str, tuple[dict, object, InputMaker]] = {}
        self.refs: dict[str, list[torch.Tensor]] = {}
        self.ref_inputs: dict[str, tuple] = {}  # tag -> (key, workload, axes, seed, kind)
        self.timer: Timer | None = None
        self.compiled: dict[str, object] = {}

    def handle(self, msg: dict) -> dict:
        op = msg.get("op")
        handler = {
            "problem": self.problem,
            "reference": self.reference,
            "compare": self.compare,
            "release": self.release,
            "baseline": self.baseline,
            "ceilings": self.ceilings,
        }.get(op)
        if handler is None:
            return {"ok": False, "message": f"unknown op {op!r}"}
        try:
            return handler(msg)
        except Exception as exc:  # the problem's own code failed: report, keep serving
            return {
                "ok": False,
                "message": f"{type(exc).__name__}: {exc}"[:2000],
                "traceback": traceback.format_exc()[-4000:],
            }

    # -- problems and references ------------------------------------------------------------
    def problem(self, msg: dict) -> dict:
        key = msg["key"]
        if key not in self.problems:
            d = msg["definition"]
            module = load_module_from_source(d["reference"], self.workdir / "ref", "reference")
            self.problems[key] = (d, module, InputMaker(d, self.device, module, msg.get("blob_root")))
        return {"ok": True}

    def _run_reference(self, key: str, workload: dict, axes: dict, seed: int, kind: str, float64: bool = False):
        d, module, maker = self.problems[key]
        args = maker.make(workload, axes, seed, kind)
        if float64:  # the same inputs, evaluated in float64: the (near) exact answer
            args = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        with torch.no_grad():
            result = module.run(*args)
        if self.cuda:
            T.cuda_sync()
        return normalize_outputs(result, list(d["outputs"])), args

    def reference(self, msg: dict) -> dict:
        key = msg["key"]
        rounds = []
        for rnd in msg["rounds"]:
            try:
                outs, _ = self._run_reference(key, msg["workload"], msg["axes"], rnd["seed"], rnd["kind"])
            except Exception as exc:
                rounds.append({"tag": rnd["tag"], "ok": False, "message": f"{type(exc).__name__}: {exc}"[:1000]})
                continue
            self.refs[rnd["tag"]] = outs
            self.ref_inputs[rnd["tag"]] = (key, msg["workload"], msg["axes"], rnd["seed"], rnd["kind"])
            finite = all(
                bool(torch.isfinite(o).all()) if o.is_floating_point() else True for o in outs
            )
            rounds.append(
                {
                    "tag": rnd["tag"],
                    "ok": True,
                    "finite": finite,
                    "outputs": [{"shape": list(o.shape), "dtype": str(o.dtype).replace("torch.", "")} for o in outs],
                }
            )
        return {"ok": True, "rounds": rounds}

    def compare(self, msg: dict) -> dict:
        tag = msg["tag"]
        refs = self.refs.pop(tag, None)
        origin = self.ref_inputs.pop(tag, None)
        if refs is None:
            return {"ok": False, "message": f"no reference held for {tag}"}
        metas, tols, names = msg["outputs"], msg["tolerances"], msg["names"]
        if len(metas) != len(refs):
            return {
                "ok": True,
                "passed": False,
                "status": "INCORRECT_SHAPE",
                "message": f"{len(metas)} outputs, expected {len(refs)}",
            }
        reports = []
        for meta, ref, tol, name in zip(metas, refs, tols, names):
            try:
                out = read_tensor(meta, self.device)
            except (ValueError, OSError) as exc:
                return {"ok": True, "passed": False, "status": "RUNTIME_ERROR", "message": str(exc)}
            adversarial = origin is not None and origin[4] != "normal"
            report = compare(out, ref, tol["atol"], tol["rtol"], name, row_scaled=adversarial)
            if not report["ok"] and report["status"] == "INCORRECT_NUMERICAL" and origin is not None:
                report = self._against_float64(origin, len(reports), out, report, tol, name)
            reports.append(report)
            if not report["ok"]:
                return {"ok": True, "passed": False, "status": report["status"],
                        "message": report["message"], "reports": reports}
        return {"ok": True, "passed": True, "status": "PASSED", "reports": reports}

    def _against_float64(self, origin, index: int, out, report: dict, tol: dict, name: str) -> dict:
        """A reference that rounds intermediates (bf16 products added to a residual, say)
        can differ from a more accurate kernel by more than the tolerance on adversarial
        inputs. An output that matches the same reference evaluated in float64 is right."""
        try:
            exact, _ = self._run_reference(*origin, float64=True)
        except Exception:  # a reference that only runs in its own dtypes
            return report
        if index >= len(exact) or not exact[index].is_floating_point():
            return report
        hi = compare(out.double(), exact[index].to(torch.float64), tol["atol"], tol["rtol"], name,
                     row_scaled=origin[4] != "normal")
        if hi["ok"]:
            return {**hi, "via": "float64 reference", "reference_mismatch": report.get("message")}
        return report

    def release(self, msg: dict) -> dict:
        tags = msg.get("tags")
        for t in list(self.refs) if tags is None else tags:
            self.refs.pop(t, None)
            self.ref_inputs.pop(t, None)
        if self.cuda:
            torch.cuda.empty_cache()
        return {"ok": True}

    # -- baselines and ceilings -------------------------------------------------------------
    def baseline(self, msg: dict) -> dict:
        key, cfg = msg["key"], msg["config"]
        d, module, maker = self.problems[key]
        if self.timer is None:
            self.timer = Timer(self.device)
        sets = [maker.make(msg["workload"], msg["axes"], s, "normal") for s in msg["sets"]]
        out: dict = {"ok": True}
        flops = None
        if msg.get("count_flops"):
            try:
                from torch.utils.flop_counter import FlopCounterMode

                with torch.no_grad(), FlopCounterMode(display=False) as counter:
                    module.run(*sets[0])
                flops = float(counter.get_total_flops())
            except Exception as exc:  # counting is best effort
                out["flops_error"] = str(exc)[:300]
        out["flops"] = flops

        def timed(fn):
            def call(k: int):
                with torch.no_grad():
                    return fn(*sets[k])

            return self.timer.measure(
                call, len(sets), cfg["min_iters"], cfg["max_iters"], cfg["target_time_s"],
                cfg["warmup_time_s"], max_time_s=cfg.get("max_timing_s"),
            )

        out["eager"] = timed(module.run)
        if msg.get("compile"):
            # the guard reads only baselines made with the fall-back check below; one that
            # fell back is reported, and the guard asks no more compile times of that problem
            # (dynamo may then skip the function without counting anything)
            out["compile_checked"] = True
            try:
                if key not in self.compiled:
                    self.compiled[key] = _compile(module.run, msg.get("compile_mode") or "default")
                before = _dynamo_counters()
                out["compiled"] = timed(self.compiled[key])
                out["compile_counters"] = after = _dynamo_counters()
                if before is None or after is None:
                    out["compiled"] = None
                    out["compile_error"] = "dynamo's counters are not readable: a fall-back to eager cannot be ruled out"
                elif after["frames_total"] - before["frames_total"] > after["frames_ok"] - before["frames_ok"]:
                    # dynamo gave up on a frame (a recompile limit, an unsupported construct)
                    # and ran it eagerly: that time is not torch.compile's
                    out["compiled"] = None
                    out["compile_fell_back"] = True
                    out["compile_error"] = "torch.compile fell back to eager on this workload (a frame failed to compile)"
            except Exception as exc:
                out["compiled"] = None
                out["compile_error"] = f"{type(exc).__name__}: {exc}"[:500]
        return out

    def ceilings(self, msg: dict) -> dict:
        return {"ok": True, "ceilings": ceilings.measure(self.device)}


# Recompilations allowed per function: each workload may be a new shape, and a problem has
# up to 16 visible workloads (dynamo's default, 8, would run the rest eagerly).
RECOMPILE_LIMIT = 64


def _compile(fn, mode: str, backend: str = "inductor"):
    """``torch.compile`` of the reference's ``run`` itself. A grad-mode decorator such as
    ``@torch.no_grad()`` wraps every problem's ``run`` in one and the same wrapper function,
    whose compiled code dynamo caches on that shared code object: its recompile limit was then
    reached across problems and every later problem ran eagerly under the name of compile.
    Only such wrappers are removed: the caller already runs every baseline under
    ``torch.no_grad()``, which a removed ``no_grad``/``inference_mode`` wrapper repeats (an
    ``enable_grad`` one would not, but a reference computes the same values either way); any
    other decorator (autocast, a cache, argument casting) changes what is computed and stays."""
    import torch._dynamo.config as dynamo_config

    for name in ("recompile_limit", "cache_size_limit"):  # the name changed across versions
        if getattr(dynamo_config, name, RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
            setattr(dynamo_config, name, RECOMPILE_LIMIT)
    while _is_grad_mode_wrapper(fn):
        fn = fn.__wrapped__
    return torch.compile(fn, mode=None if backend != "inductor" else mode, backend=backend)


def _is_grad_mode_wrapper(fn) -> bool:
    """The wrapper torch's grad-mode context managers (no_grad, enable_grad, inference_mode,
    set_grad_enabled) put around a decorated function."""
    code = getattr(fn, "__code__", None)
    return (hasattr(fn, "__wrapped__") and code is not None and code.co_name == "decorate_context"
            and Path(code.co_filename).name == "_contextlib.py")


def _dynamo_counters() -> dict | None:
    """What torch.compile did in this worker so far: frames compiled, graphs, graph breaks,
    recompilations. A compile baseline no faster than eager with no graph here was eager."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - diagnostics only
        return None
    return {
        "frames_ok": int(counters["frames"].get("ok", 0)),
        "frames_total": int(counters["frames"].get("total", 0)),
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else None,
    }
