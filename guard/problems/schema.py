"""Pydantic models of the SOL-ExecBench / FlashInfer-Trace problem format.

``Definition`` mirrors ``definition.json`` and ``Workload`` one line of ``workload.jsonl``.
Unknown upstream fields are kept (``extra="allow"``) so a problem survives a round trip.
KernelArc's own additions live under the single ``kernelarc`` key and never change the
meaning of upstream fields.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from . import formulas
from .dtypes import DTYPES, dtype_info

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def check_name(name: str, what: str = "name") -> str:
    if not NAME_RE.match(name) or ".." in name:
        raise ValueError(f"invalid {what} {name!r}: use letters, digits, '_', '-', '.' (at most 128, no '..')")
    return name


# --------------------------------------------------------------------------- axes


class ConstAxis(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["const"] = "const"
    value: int
    description: str | None = None


class VarAxis(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["var"] = "var"
    description: str | None = None


class ExprAxis(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["expr"] = "expr"
    expression: str
    description: str | None = None


Axis = Annotated[Union[ConstAxis, VarAxis, ExprAxis], Field(discriminator="type")]


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    shape: list[Union[str, int]] | None = None  # None: a scalar argument
    dtype: str
    description: str | None = None

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        dtype_info(v)
        return v

    @property
    def is_scalar(self) -> bool:
        return self.shape is None


# ----------------------------------------------------------------------- workloads


class RandomInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["random"] = "random"


class ScalarInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["scalar"] = "scalar"
    value: Union[bool, int, float]


class SafetensorsInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["safetensors"] = "safetensors"
    path: str
    tensor_key: str


class CustomInput(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["custom"] = "custom"


InputSpec = Annotated[Union[RandomInput, ScalarInput, SafetensorsInput, CustomInput], Field(discriminator="type")]


class ToleranceSpec(BaseModel):
    """SOL-ExecBench's per-workload correctness bounds (``workload.tolerance``); its defaults
    apply to a workload that sets none (``guard/problems/tolerance.py`` says how KernelArc
    combines them with its own per-dtype tolerances)."""

    model_config = ConfigDict(extra="allow")
    max_atol: float = Field(default=1e-2, ge=0)
    max_rtol: float = Field(default=1e-2, ge=0)
    required_matched_ratio: float = Field(default=0.99, ge=0, le=1)
    max_error_cap: float | None = Field(default=None, ge=0)
    allow_negative_inf: bool = False


class Workload(BaseModel):
    """One concrete shape: values of the var axes and how each input is made."""

    model_config = ConfigDict(extra="allow")
    uuid: str
    axes: dict[str, int] = Field(default_factory=dict)
    inputs: dict[str, InputSpec] = Field(default_factory=dict)
    tolerance: ToleranceSpec | None = None  # None: SOL-ExecBench's defaults

    @field_validator("uuid")
    @classmethod
    def _uuid(cls, v: str) -> str:
        if not v or len(v) > 128:
            raise ValueError("workload uuid must be 1..128 characters")
        return v

    @field_validator("axes")
    @classmethod
    def _axes_non_negative(cls, v: dict[str, int]) -> dict[str, int]:
        for k, x in v.items():
            if x < 0:
                raise ValueError(f"axis {k} is negative ({x})")
        return v

    @model_validator(mode="after")
    def _custom_all_or_nothing(self) -> "Workload":
        kinds = {type(s) for s in self.inputs.values()}
        if CustomInput in kinds and len(kinds - {CustomInput, ScalarInput}) > 0:
            raise ValueError("a workload cannot mix custom inputs with random/safetensors inputs")
        return self


# ------------------------------------------------------------- KernelArc's own fields


class Tolerance(BaseModel):
    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)


class KernelArcFields(BaseModel):
    """Fields of KernelArc's own, kept under the ``kernelarc`` key of ``definition.json``."""

    model_config = ConfigDict(extra="forbid")
    op_family: str | None = None
    bound: Literal["memory", "compute", "mixed"] | None = None
    tags: list[str] = Field(default_factory=list)
    # Formulas over the axes. FLOPs: arithmetic the op must do; bytes: the fewest bytes it
    # must move (each input read once, each output written once).
    flops: str | None = None
    bytes: str | None = None
    tolerance: dict[str, Tolerance] = Field(default_factory=dict)
    cpu_workloads: list[Workload] | None = None
    # largest tensor (elements) of the CPU workloads derived when none are given; None: the
    # default (2^18). An import lowers it for a reference whose compute would be slow.
    cpu_element_budget: int | None = Field(default=None, ge=1)
    heldout_count: int = Field(default=3, ge=0, le=16)
    heldout_axes: list[str] | None = None  # var axes held-out workloads may vary (None: all)
    models: list[str] = Field(default_factory=list)  # where the shapes come from
    # True: two calls on the same inputs must give bitwise identical outputs; False: outputs
    # within the tolerance (float atomics, cuDNN's non-deterministic algorithms, which a
    # reference such as a KernelBench model may itself use)
    deterministic: bool = True
    # adversarial value rounds (mixed, large and tiny scales): True scales every float input,
    # a list only the inputs it names (the activations, where scaling the parameters too, a
    # LayerNorm's weight and bias say, makes the result cancel), False none
    adversarial: bool | list[str] = True
    source: dict[str, Any] = Field(default_factory=dict)  # import provenance

    @field_validator("tolerance")
    @classmethod
    def _tol_dtypes(cls, v: dict[str, Tolerance]) -> dict[str, Tolerance]:
        for k in v:
            dtype_info(k)
        return v

    @field_validator("flops", "bytes")
    @classmethod
    def _formula_parses(cls, v: str | None) -> str | None:
        if v is not None:
            formulas.names_in(v)
        return v


# ---------------------------------------------------------------------- definition


class Definition(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    op_type: str | None = None
    description: str | None = None
    axes: dict[str, Axis] = Field(default_factory=dict)
    constraints: list[str] = Field(default_factory=list)
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    reference: str
    custom_inputs_entrypoint: str | None = None
    tags: list[str] = Field(default_factory=list)
    kernelarc: KernelArcFields = Field(default_factory=KernelArcFields)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "problem name")

    @model_validator(mode="after")
    def _consistent(self) -> "Definition":
        if not self.outputs:
            raise ValueError("a definition needs at least one output")
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            for tname, spec in specs.items():
                if not tname.isidentifier():
                    raise ValueError(f"{kind} name {tname!r} is not a Python identifier")
                for dim in spec.shape or []:
                    if isinstance(dim, str) and dim not in self.axes:
                        raise ValueError(f"{kind} {tname} uses undeclared axis {dim!r}")
        for aname, axis in self.axes.items():
            if isinstance(axis, ExprAxis):
                unknown = formulas.names_in(axis.expression) - set(self.axes)
                if unknown:
                    raise ValueError(f"axis {aname} refers to unknown axes {sorted(unknown)}")
        if "def run" not in self.reference:
            raise ValueError("the reference must define run(...)")
        scaled = self.kernelarc.adversarial
        if isinstance(scaled, list):
            floats = [n for n, t in self.inputs.items() if t.shape is not None and dtype_info(t.dtype).is_float]
            strangers = [n for n in scaled if n not in floats]
            if strangers or not scaled:
                raise ValueError(
                    f"kernelarc.adversarial names no floating-point tensor input: {strangers or scaled} "
                    f"(those of the definition: {floats}; true scales them all, false none)"
                )
        return self

    # -- axes -------------------------------------------------------------------
    @property
    def var_axes(self) -> list[str]:
        return [n for n, a in self.axes.items() if isinstance(a, VarAxis)]

    def resolve_axes(self, workload_axes: dict[str, int]) -> dict[str, int]:
        """All axis values for a workload: const, var (from the workload) and expr."""
        values: dict[str, int] = {}
        for name, axis in self.axes.items():
            if isinstance(axis, ConstAxis):
                values[name] = axis.value
            elif isinstance(axis, VarAxis):
                if name not in workload_axes:
                    raise ValueError(f"workload does not set var axis {name!r}")
                values[name] = int(workload_axes[name])
        pending = {n: a for n, a in self.axes.items() if isinstance(a, ExprAxis)}
        for _ in range(len(pending) + 1):
            for name, axis in list(pending.items()):
                if formulas.names_in(axis.expression) <= set(values):
                    values[name] = int(formulas.evaluate(axis.expression, values))
                    del pending[name]
        if pending:
            raise ValueError(f"cannot resolve expr axes {sorted(pending)} (cyclic?)")
        return values

    def shape_of(self, spec: TensorSpec, axes: dict[str, int]) -> tuple[int, ...]:
        if spec.shape is None:
            return ()
        return tuple(axes[d] if isinstance(d, str) else int(d) for d in spec.shape)

    # -- cost model ---------------------------------------------------------------
    def io_bytes(self, axes: dict[str, int]) -> float:
        """Bytes of every tensor input and output, each counted once."""
        total = 0.0
        for spec in list(self.inputs.values()) + list(self.outputs.values()):
            if spec.shape is not None:
                total += math.prod(self.shape_of(spec, axes)) * dtype_info(spec.dtype).bytes
        return total

    def bytes_moved(self, axes: dict[str, int]) -> float:
        if self.kernelarc.bytes:
            return float(formulas.evaluate(self.kernelarc.bytes, axes))
        return self.io_bytes(axes)

    def flops(self, axes: dict[str, int]) -> float | None:
        if self.kernelarc.flops:
            return float(formulas.evaluate(self.kernelarc.flops, axes))
        return None

    def tolerance_for(self, dtype: str) -> Tolerance:
        if dtype in self.kernelarc.tolerance:
            return self.kernelarc.tolerance[dtype]
        info = DTYPES[dtype]
        return Tolerance(atol=info.atol, rtol=info.rtol)

    def content_hash(self) -> str:
        """Hash of everything that changes what is measured (not descriptions)."""
        payload = self.model_dump(mode="json", exclude={"description": True, "kernelarc": {"models", "source", "tags"}})
        if payload["kernelarc"].get("cpu_element_budget") is None:  # hashes from before it existed
            payload["kernelarc"].pop("cpu_element_budget", None)
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def for_candidates(self) -> dict[str, Any]:
        """The definition as a candidate's worker gets it: without the import's provenance,
        whose path names the folder the problem came from, with its held-out workloads, which
        the sandbox shows where it lies under a system folder (red team, session 39)."""
        return self.model_dump(mode="json", exclude_none=True, exclude={"kernelarc": {"source"}})
