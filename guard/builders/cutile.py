"""cuTile Python (package cuda-tile, module ``cuda.tile``): a ``.py`` candidate whose
``@ct.kernel`` functions are launched with ``ct.launch`` on torch tensors. Its quickstart
lists GPUs of compute capability 8.x, 10.x, 11.x and 12.x and NVIDIA driver r580 or later:
Hopper (9.0, the H100 and H200) is not among them, so a guard on a Hopper GPU refuses cuTile
candidates and says why."""

from __future__ import annotations

from .dsl import DslBuilder, Requirement

REQUIREMENT = Requirement(
    language="cutile", title="cuTile", package="cuda-tile", module="cuda.tile",
    capability_majors=(8, 10, 11, 12),
    device_note="(cuTile Python's quickstart; Hopper, 9.x, is not supported)",
)


class CutileBuilder(DslBuilder):
    requirement = REQUIREMENT
