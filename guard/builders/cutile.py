"""cuTile Python (package cuda-tile, module ``cuda.tile``): a ``.py`` candidate whose
``@ct.kernel`` functions are launched with ``ct.launch`` on torch tensors. It needs NVIDIA
driver r580 or later and the ``tileiras`` compiler (CUDA 13.1 or later: a system toolkit, or the
pip packages of ``cuda-tile[tileiras]``). Its documentation lists GPUs of compute capability 8.x,
10.x, 11.x and 12.x; Hopper (9.0, the H100 and H200) came with cuda-tile 1.4 and tileiras 13.3
(the maintainers, NVIDIA/cutile-python issue 27): the tileiras 13.4 of the pip packages builds
cuTile kernels for sm_90. An older tileiras on a Hopper GPU fails the build, with its message."""

from __future__ import annotations

from .dsl import DslBuilder, Requirement

REQUIREMENT = Requirement(
    language="cutile",
    title="cuTile",
    package="cuda-tile",
    module="cuda.tile",
    capability_majors=(8, 9, 10, 11, 12),
    device_note="(cuTile Python's documentation; Hopper, 9.x, needs tileiras 13.3 or later)",
)


class CutileBuilder(DslBuilder):
    requirement = REQUIREMENT
