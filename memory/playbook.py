"""Long-term knowledge as data: optimization methods (``playbooks/methods/*.json``), loaded
and validated here. The decision policy that picks among them is ``memory/policy.py``."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import playbooks
from guard.problems.families import FAMILY_RULES

FAMILIES = {name for name, _ in FAMILY_RULES}

Category = Literal[
    "launch",
    "memory",
    "compute",
    "advanced",
    "architecture",
    "kernel_specific",
    "library",
    "precision",
    "repair",
]
# Measured signals the policy derives from a verdict; a method lists those it answers.
Signal = Literal[
    "memory_bound",
    "compute_bound",
    "far_from_sol",
    "near_sol",
    "small_shapes_lag",
    "large_shapes_lag",
    "launch_overhead",
    "low_parallelism",
    "compile_error",
    "incorrect_numerical",
    "incorrect_shape",
    "incorrect_dtype",
    "runtime_error",
    "timeout",
    "reward_hack",
    "nondeterministic",
    "plateau",
    "no_correct_candidate",
]
TIER_OF = {"launch": 1, "memory": 2, "compute": 3, "advanced": 4, "architecture": 5, "kernel_specific": 6}


class Method(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[a-z][a-z0-9_]{2,63}$")
    name: str
    category: Category
    op_families: list[str] = Field(default_factory=list)  # empty: any family
    signals: list[Signal] = Field(min_length=1)
    backends: list[Literal["triton", "cuda_cpp", "pytorch"]] = Field(min_length=1)
    architectures: list[str] = Field(default_factory=lambda: ["any"])
    rationale: str = Field(min_length=20)
    how_triton: str | None = None
    how_cuda: str | None = None
    pitfalls: list[str] = Field(default_factory=list)
    expected_gain: str | None = None

    @field_validator("how_triton", "how_cuda")
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("leave it out rather than empty")
        return v

    @field_validator("op_families")
    @classmethod
    def _known_families(cls, v: list[str]) -> list[str]:
        unknown = set(v) - FAMILIES
        if unknown:
            raise ValueError(f"unknown op families {sorted(unknown)}; known: {sorted(FAMILIES)}")
        return v

    @model_validator(mode="after")
    def _how_for_each_backend(self) -> Method:
        if "triton" in self.backends and not self.how_triton:
            raise ValueError(f"{self.id}: lists triton but says nothing in how_triton")
        if "cuda_cpp" in self.backends and not self.how_cuda:
            raise ValueError(f"{self.id}: lists cuda_cpp but says nothing in how_cuda")
        return self

    @property
    def tier(self) -> int | None:
        return TIER_OF.get(self.category)


@lru_cache(maxsize=4)
def load_methods(folder: str | None = None) -> tuple[Method, ...]:
    base = Path(folder) if folder else playbooks.METHODS_DIR
    methods: list[Method] = []
    for path in sorted(base.glob("*.json")):
        data = json.loads(path.read_text())
        for item in data["methods"]:
            methods.append(Method.model_validate(item))
    ids = [m.id for m in methods]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise ValueError(f"duplicate method ids: {sorted(dupes)}")
    return tuple(methods)
