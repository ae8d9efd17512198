"""Making the inputs of a workload, identically in every worker that is given the same seed.

Rounds differ by ``kind``: "normal" (standard normal), "mixed" (rows at scales from 1e-3
to 1e3), "large" (magnitudes that overflow naive low-precision intermediates) and "tiny"
(values near zero). Adversarial kinds only change float tensors made at random; the guard
drops a round when the reference itself is not finite on it (the op does not allow it).
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .refill_kinds import INDICES, INDPTR, LABELS, is_float_dtype

ROUND_KINDS = ("normal", "mixed", "large", "tiny")
LARGE_SCALE = {
    "float16": 2.0**13,
    "bfloat16": 2.0**30,
    "float32": 2.0**30,
    "float64": 2.0**60,
    "float8_e4m3fn": 224.0,
    "float8_e5m2": 16384.0,
}
TINY_SCALE = {
    "float16": 2.0**-10,
    "bfloat16": 2.0**-30,
    "float32": 2.0**-40,
    "float64": 2.0**-100,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-8,
}


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"dtype {name!r} is not available in this torch")
    return dt


def seed_default_generators(seed: int) -> None:
    """What ``torch.manual_seed`` does for the generators a custom input generator draws from:
    the CPU's and every GPU's of this process. ``torch.manual_seed`` also seeds backends that
    are not in use (XPU, MTIA) through their lazy-init queues, each formatting a stack trace:
    a millisecond per call on the H200 machine, before every timed call of a problem with a
    custom generator (session 12's profile). The values drawn are the same."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
    elif torch.cuda.is_available():  # queued for CUDA's initialisation, as torch.manual_seed does
        torch.cuda.manual_seed_all(seed)


def sub_seed(seed: int, *parts: object) -> int:
    h = seed & 0xFFFFFFFFFFFF
    for p in parts:
        for ch in str(p):
            h = (h * 1_000_003 + ord(ch)) & 0xFFFFFFFFFFFF
    return h


def spec_shape(spec: dict[str, Any], axes: dict[str, int]) -> tuple[int, ...]:
    """A tensor spec's shape with its named axes resolved (a scalar spec: ``()``)."""
    return tuple(axes[d] if isinstance(d, str) else int(d) for d in (spec.get("shape") or []))


class InputMaker:
    """Inputs for one definition on one device. ``reference_module`` provides custom inputs."""

    def __init__(
        self,
        definition: dict[str, Any],
        device: str,
        reference_module: ModuleType | None = None,
        blob_root: str | None = None,
    ):
        self.d = definition
        self.device = torch.device(device)
        self.module = reference_module
        self.blob_root = Path(blob_root) if blob_root else None

    # -- public -------------------------------------------------------------------------
    def make(self, workload: dict[str, Any], axes: dict[str, int], seed: int, kind: str = "normal") -> list[Any]:
        """Arguments in definition order (tensors and Python scalars)."""
        specs = workload.get("inputs", {})
        values: dict[str, Any]
        if self.d.get("custom_inputs_entrypoint") and any(s.get("type") == "custom" for s in specs.values()):
            values = self._custom(axes, specs, seed)
        else:
            values = {}
            synthesized: set[str] = set()
            for name, spec in self.d["inputs"].items():
                ispec = specs.get(name, {"type": "random"})
                values[name] = self._one(name, spec, ispec, axes, seed, self._kind_of(name, kind))
                if ispec.get("type") != "scalar" and not (
                    ispec.get("type") == "safetensors" and self._safetensors(ispec) is not None
                ):
                    synthesized.add(name)
            self._fix_index_pairs(values, synthesized, axes, seed)
        missing = [n for n in self.d["inputs"] if n not in values]
        if missing:
            raise ValueError(f"inputs not produced: {missing}")
        return [values[n] for n in self.d["inputs"]]

    def _kind_of(self, name: str, kind: str) -> str:
        """The round's kind for input ``name``: an adversarial round scales only the inputs the
        definition names in ``kernelarc.adversarial`` where it names some; the others are drawn
        as in a normal round."""
        scaled = (self.d.get("kernelarc") or {}).get("adversarial", True)
        return kind if not isinstance(scaled, list) or name in scaled else "normal"

    # -- kinds of input -------------------------------------------------------------------
    def _custom(self, axes: dict[str, int], specs: dict[str, Any], seed: int) -> dict[str, Any]:
        fn = getattr(self.module, self.d["custom_inputs_entrypoint"])
        scalars = {n: s["value"] for n, s in specs.items() if s.get("type") == "scalar"}
        seed_default_generators(seed)
        produced = fn({**axes, **scalars}, self.device)
        if not isinstance(produced, dict):
            raise TypeError("generate_inputs must return a dict of inputs")
        return {**scalars, **produced}

    def _one(
        self, name: str, tspec: dict[str, Any], ispec: dict[str, Any], axes: dict[str, int], seed: int, kind: str
    ) -> Any:
        kind_of = ispec.get("type", "random")
        if kind_of == "scalar":
            return ispec["value"]
        shape = spec_shape(tspec, axes)
        dtype = tspec["dtype"]
        if tspec.get("shape") is None:  # a scalar the workload did not set
            return 1e-5 if dtype.startswith("float") else 1
        if kind_of == "safetensors":
            loaded = self._safetensors(ispec)
            if loaded is not None:
                return loaded.to(self.device)
        gen = torch.Generator(device=self.device).manual_seed(sub_seed(seed, name))
        if dtype.startswith("float") or dtype == "bfloat16":
            return self._float(shape, dtype, gen, kind)
        if dtype == "bool":
            return torch.randint(0, 2, shape, generator=gen, device=self.device).bool()
        return self._int(name, shape, dtype, gen, axes)

    def _float(self, shape: tuple[int, ...], dtype: str, gen: torch.Generator, kind: str) -> torch.Tensor:
        x = torch.randn(shape, generator=gen, device=self.device, dtype=torch.float32)
        if kind == "mixed" and x.numel():
            rows = shape[:-1] + (1,) if len(shape) > 1 else shape
            x = x * torch.pow(10.0, self._row_exponents(rows, gen))
        elif kind == "large":
            x = x * LARGE_SCALE.get(dtype, 1.0)
        elif kind == "tiny":
            x = x * TINY_SCALE.get(dtype, 1.0)
        return x.to(torch_dtype(dtype))

    def _row_exponents(self, rows: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        """The mixed round's scale of each row, as a power of ten from -3 to 3: the range cut
        into one stratum per row, each row given a random point of its own stratum, the strata
        in random order. Every part of the range then appears once there are a few rows: drawn
        independently, the rows of a 1- and a 7-row workload all missed the small scales that
        show a wrong epsilon about one time in twenty, and that bug was caught only later, on a
        held-out shape, without the round's name."""
        n = math.prod(rows)
        strata = torch.randperm(n, generator=gen, device=self.device).to(torch.float32)
        inside = torch.rand(n, generator=gen, device=self.device)
        return ((strata + inside) / n * 6 - 3).reshape(rows)

    def _int(
        self, name: str, shape: tuple[int, ...], dtype: str, gen: torch.Generator, axes: dict[str, int]
    ) -> torch.Tensor:
        high = self.int_high(name, axes, indices=False)
        return torch.randint(0, high, shape, generator=gen, device=self.device, dtype=torch_dtype(dtype))

    def int_high(self, name: str, axes: dict[str, int], indices: bool = True) -> int:
        """The exclusive upper bound of the values of the synthesized integer input ``name``:
        indices stay below the page count (else the count of indices); labels below the
        last axis of the first float input; others below 64. ``indices=False``: the bound of
        the first draw, before the paged-KV convention (``_fix_index_pairs``) redraws them."""
        if indices and INDICES.search(name):
            page_axes = [a for a in axes if "page" in a and "size" not in a]
            if page_axes:
                return max(1, axes[page_axes[0]])
            return max(1, math.prod(spec_shape(self.d["inputs"][name], axes)))
        if LABELS.search(name):
            floats = [s for s in self.d["inputs"].values() if s.get("shape") and is_float_dtype(str(s["dtype"]))]
            if floats:
                last = floats[0]["shape"][-1]
                return max(1, axes[last] if isinstance(last, str) else int(last))
        return 64

    def offsets_end(self, name: str, axes: dict[str, int], indices: list[str]) -> int:
        """The last value of the synthesized offsets ``name``: the count of the first of the
        synthesized integer ``indices`` inputs (sorted by name), else four times the count of
        offsets. The first making and every refill follow it (``runner/refill.py``)."""
        spec = self.d["inputs"][indices[0] if indices else name]
        count = math.prod(spec_shape(spec, axes))
        return count if indices else 4 * count

    def _fix_index_pairs(self, values: dict[str, Any], synthesized: set[str], axes: dict[str, int], seed: int) -> None:
        """Paged-KV convention: offsets run from 0 to the number of indices; indices stay
        below the page count. Applied to integer index inputs the guard synthesized."""

        def ints(pattern: re.Pattern[str]) -> list[str]:
            return [
                n
                for n in synthesized
                if pattern.search(n) and isinstance(values[n], torch.Tensor) and not values[n].is_floating_point()
            ]

        idx_names, ptr_names = sorted(ints(INDICES)), sorted(ints(INDPTR))
        gen = torch.Generator(device="cpu").manual_seed(sub_seed(seed, "index-pairs"))
        for n in idx_names:
            t = values[n]
            hi = self.int_high(n, axes)
            values[n] = torch.randint(0, hi, t.shape, generator=gen, dtype=t.dtype).to(self.device)
        for n in ptr_names:
            t = values[n]
            total = self.offsets_end(n, axes, idx_names)
            k = t.numel()
            if k == 0:
                continue
            cuts = torch.randint(0, total + 1, (max(0, k - 2),), generator=gen).sort().values
            ptr = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.full((1,), total)])[:k]
            values[n] = ptr.to(dtype=t.dtype, device=self.device)

    def _safetensors(self, ispec: dict[str, Any]) -> torch.Tensor | None:
        if self.blob_root is None:
            return None
        path = self.blob_root / ispec["path"]
        if not path.is_file():
            return None
        return read_safetensors(path)[ispec["tensor_key"]]


_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The safetensors format: 8-byte little-endian header size, JSON header, raw data."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        dt = _ST_DTYPES[meta["dtype"]]
        buf = bytearray(data[start:end])
        t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
        out[key] = t.reshape(meta["shape"]) if math.prod(meta["shape"]) else t.reshape(meta["shape"])
    return out
