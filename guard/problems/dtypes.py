"""Data types by their schema names: sizes and default tolerances (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DTypeInfo:
    name: str
    bytes: float  # may be fractional for sub-byte formats
    is_float: bool
    atol: float  # default absolute tolerance
    rtol: float  # default relative tolerance
    # Largest finite magnitude (floats) used for adversarial inputs; 0 for non-floats.
    max_finite: float = 0.0


# float32 is held to 1e-4; bf16/fp16 follow SOL-ExecBench's default of 1e-2; integers are exact.
DTYPES: dict[str, DTypeInfo] = {
    d.name: d
    for d in [
        DTypeInfo("float64", 8, True, 1e-7, 1e-7, 1.7976931348623157e308),
        DTypeInfo("float32", 4, True, 1e-4, 1e-4, 3.4028234663852886e38),
        DTypeInfo("float16", 2, True, 1e-2, 1e-2, 65504.0),
        DTypeInfo("bfloat16", 2, True, 1e-2, 1e-2, 3.3895313892515355e38),
        DTypeInfo("float8_e4m3fn", 1, True, 1.25e-1, 1.25e-1, 448.0),
        DTypeInfo("float8_e5m2", 1, True, 2.5e-1, 2.5e-1, 57344.0),
        DTypeInfo("int64", 8, False, 0.0, 0.0),
        DTypeInfo("int32", 4, False, 0.0, 0.0),
        DTypeInfo("int16", 2, False, 0.0, 0.0),
        DTypeInfo("int8", 1, False, 0.0, 0.0),
        DTypeInfo("uint8", 1, False, 0.0, 0.0),
        DTypeInfo("bool", 1, False, 0.0, 0.0),
    ]
}

DTYPE_NAMES = tuple(DTYPES)


def dtype_info(name: str) -> DTypeInfo:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_NAMES)}") from None
