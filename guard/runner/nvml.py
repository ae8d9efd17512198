"""NVML readings (clocks, temperature, power, throttle reasons). No torch; optional."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

try:
    import pynvml  # from nvidia-ml-py
except ImportError:  # pragma: no cover
    pynvml = None

_inited = False


def _init() -> bool:
    global _inited
    if pynvml is None:
        return False
    if not _inited:
        try:
            pynvml.nvmlInit()
            _inited = True
        except Exception:  # no driver
            return False
    return True


def gpu_count() -> int:
    if not _init():
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0


def gpu_identity(index: int = 0) -> dict[str, str] | None:
    if not _init():
        return None
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(h)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        return {
            "name": name.decode() if isinstance(name, bytes) else name,
            "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
            "driver": _s(pynvml.nvmlSystemGetDriverVersion()),
        }
    except Exception as exc:
        log.debug("nvml identity failed: %s", exc)
        return None


def total_memory(uuid: str | None = None, index: int = 0) -> int | None:
    """The device's memory in bytes (None without NVML)."""
    if not _init():
        return None
    try:
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
    except Exception as exc:
        log.debug("nvml memory failed: %s", exc)
        return None


def minor_number(uuid: str) -> int | None:
    """The minor number of the GPU's device node (``/dev/nvidia<minor>``), None without NVML."""
    if not _init():
        return None
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
    except Exception as exc:
        log.debug("nvml minor number failed: %s", exc)
        return None


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


_REASONS = {
    "gpu_idle": 0x1,
    "app_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}


def snapshot(uuid: str | None = None, index: int = 0) -> dict[str, Any] | None:
    """Clocks (MHz), temperature (C), power (W) and active throttle reasons."""
    if not _init():
        return None
    try:
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(index)
        get_reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        mask = int(get_reasons(h))
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "throttle_reasons": [k for k, bit in _REASONS.items() if mask & bit],
        }
    except Exception as exc:
        log.debug("nvml snapshot failed: %s", exc)
        return None
