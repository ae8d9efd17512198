"""Which device(s) the guard uses, decided in the parent without importing torch.

A device has two identities:

- ``key``: the physical device (a GPU's UUID, or this CPU). Timing slots, ceilings and
  baselines belong to it, and each measurement records where it was taken (``measured_on``).
- ``group``: the devices whose measurements are comparable, GPUs of one model (``cuda-`` and
  the model's name). Agents' bests and the leaderboard are kept per group, so a swarm
  spread over the GPUs of one host works on one leaderboard; a challenger judged on one GPU
  against an incumbent measured on another has the incumbent re-measured beside it
  (``guard/pipeline.py``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import re
from dataclasses import dataclass

from . import nvml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceChoice:
    kind: str  # "cpu" or "cuda"
    key: str  # the physical device: caches, locks, where a measurement was taken
    name: str
    uuid: str | None = None
    group: str = ""  # comparable devices (same model); empty: the key
    simulated: bool = False  # one of several CPU "devices" sharing the same cores (tests)

    @property
    def compare_key(self) -> str:
        return self.group or self.key

    @property
    def identified(self) -> bool:
        """Whether the guard could tell this device apart from others of its kind: only then
        may what was measured on it (ceilings, baselines) be kept for other workspaces."""
        return not self.key.endswith("-unknown")

    def worker_env(self) -> dict[str, str]:
        """Pins a worker to this GPU: inside it, ``cuda`` is this device and no other."""
        return {"CUDA_VISIBLE_DEVICES": self.uuid} if self.kind == "cuda" and self.uuid else {}


def _cpu_identity() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} x{usable_cores()}"


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container or ``taskset`` may allow
    fewer than the machine has), which is what a CPU measurement ran on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu() -> DeviceChoice:
    ident = _cpu_identity()
    key = "cpu-" + hashlib.sha256(ident.encode()).hexdigest()[:12]
    return DeviceChoice("cpu", key, ident, group=key)


def _group_of(name: str) -> str:
    return "cuda-" + (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu")


def _gpu(index: int) -> DeviceChoice | None:
    ident = nvml.gpu_identity(index)
    if not ident:
        return None
    return DeviceChoice("cuda", f"cuda-{ident['uuid']}", ident["name"], ident["uuid"], group=_group_of(ident["name"]))


def visible_gpu_indices() -> list[int]:
    """NVML indices of the GPUs this process may use (``CUDA_VISIBLE_DEVICES``: indices or
    UUIDs, in its order). A MIG instance there is refused (ValueError), not skipped."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() == "":
        return []
    count = nvml.gpu_count()
    if visible is None:
        return list(range(count))
    by_uuid = {}
    for i in range(count):
        ident = nvml.gpu_identity(i)
        if ident:
            by_uuid[ident["uuid"]] = i
    out = []
    for item in (x.strip() for x in visible.split(",")):
        if item.isdigit() and int(item) < count:
            out.append(int(item))
        elif item in by_uuid:
            out.append(by_uuid[item])
        elif item.startswith("GPU-") and any(u.startswith(item) for u in by_uuid):
            out.append(next(i for u, i in by_uuid.items() if u.startswith(item)))
        elif item.startswith("MIG-"):
            # a slice of a GPU: its device nodes and identity differ from a whole GPU's, which
            # the sandbox and the timing slots are built around; judging on the CPU instead
            # would be a silent surprise
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES names a MIG instance ({item}): the guard judges on whole GPUs only; "
                "name a GPU by index or UUID, or use --device cpu"
            )
        else:  # CUDA stops at the first entry it cannot use
            log.warning(
                "CUDA_VISIBLE_DEVICES entry %r is not a GPU index or UUID this guard can use; "
                "the GPUs after it are ignored",
                item,
            )
            break
    return out


def resolve(choice: str = "auto") -> DeviceChoice:
    """``auto``: the first visible GPU if NVML sees one, else the CPU."""
    if choice not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {choice!r}")
    if choice == "cpu":
        return _cpu()
    indices = visible_gpu_indices()
    gpu = _gpu(indices[0]) if indices else None
    if gpu is not None:
        return gpu
    if choice == "cuda":  # NVML missing: the worker will say whether CUDA works
        return DeviceChoice("cuda", "cuda-unknown", "cuda", group="cuda-unknown")
    return _cpu()


def parse_count(text: str | int | None) -> int | None:
    """``--devices``: a positive number, or ``all`` (None)."""
    if text is None or text == "all":
        return None
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"--devices must be a positive number or 'all', not {text!r}") from None
    if n < 1:
        raise ValueError(f"--devices must be a positive number or 'all', not {text!r}")
    return n


def resolve_all(choice: str = "auto", count: int | None = 1) -> list[DeviceChoice]:
    """The devices a guard pool uses: ``count`` of them (``None``: every one visible).

    On the CPU there is one device; asking for more gives simulated devices that share its
    cores, distinct keys in one group: for exercising the scheduling and cross-device
    comparisons in tests, not for speed.
    """
    first = resolve(choice)
    if first.kind == "cpu":
        n = count or 1
        if n == 1:
            return [first]
        return [
            DeviceChoice(
                "cpu", f"{first.key}-sim{i}", f"{first.name} (simulated device {i})", group=first.key, simulated=True
            )
            for i in range(n)
        ]
    if first.key == "cuda-unknown":
        if count not in (None, 1):
            raise ValueError("cannot tell the GPUs apart without NVML (nvidia-ml-py)")
        return [first]
    gpus = [g for g in (_gpu(i) for i in visible_gpu_indices()) if g is not None]
    if count is not None and count > len(gpus):
        raise ValueError(f"{count} devices asked for, {len(gpus)} GPU(s) visible")
    # GPUs of different models fall in different groups: each keeps its own leaderboard
    return gpus if count is None else gpus[:count]
