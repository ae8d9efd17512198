"""Which device the guard uses, decided in the parent without importing torch."""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import dataclass

from . import nvml


@dataclass(frozen=True)
class DeviceChoice:
    kind: str  # "cpu" or "cuda"
    key: str  # stable identity for caches, locks and comparisons
    name: str
    uuid: str | None = None


def _cpu_identity() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}"


def resolve(choice: str = "auto") -> DeviceChoice:
    """``auto``: the first visible GPU if NVML sees one, else the CPU."""
    if choice not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {choice!r}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = nvml.gpu_count() if visible != "" else 0
    if choice == "cuda" or (choice == "auto" and gpus > 0):
        index = 0
        if visible and visible.split(",")[0].strip().isdigit():
            index = int(visible.split(",")[0])
        ident = nvml.gpu_identity(index) if gpus else None
        if ident:
            return DeviceChoice("cuda", f"cuda-{ident['uuid']}", ident["name"], ident["uuid"])
        if choice == "cuda":  # NVML missing: the worker will say whether CUDA works
            return DeviceChoice("cuda", "cuda-unknown", "cuda")
    ident = _cpu_identity()
    key = "cpu-" + hashlib.sha256(ident.encode()).hexdigest()[:12]
    return DeviceChoice("cpu", key, ident)
