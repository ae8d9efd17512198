"""Our pydantic models of SOL-ExecBench's published trace schema (``docs/trace.md`` and
``core/data/trace.py`` of NVIDIA/SOL-ExecBench, read, not copied).

A trace is one benchmark run: the definition's name, the solution's name, the workload as run
and the evaluation (status, log, correctness, performance, environment, timestamp). Which of
correctness and performance are present depends on the status (the schema's "nullable
table"); the model enforces it, as that schema's loader does. Extra fields are refused here so
that nothing we write falls outside the published schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

NonEmpty = Annotated[str, Field(min_length=1)]

STATUSES = (
    "PASSED",
    "INVALID_REFERENCE",
    "INCORRECT_SHAPE",
    "INCORRECT_NUMERICAL",
    "INCORRECT_DTYPE",
    "RUNTIME_ERROR",
    "COMPILE_ERROR",
    "TIMEOUT",
    "REWARD_HACK",
)
Status = Literal[
    "PASSED",
    "INVALID_REFERENCE",
    "INCORRECT_SHAPE",
    "INCORRECT_NUMERICAL",
    "INCORRECT_DTYPE",
    "RUNTIME_ERROR",
    "COMPILE_ERROR",
    "TIMEOUT",
    "REWARD_HACK",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RandomInput(_Strict):
    type: Literal["random"] = "random"


class ScalarInput(_Strict):
    type: Literal["scalar"] = "scalar"
    value: Union[bool, int, float]


class SafetensorsInput(_Strict):
    type: Literal["safetensors"] = "safetensors"
    path: NonEmpty
    tensor_key: NonEmpty


class CustomInput(_Strict):
    type: Literal["custom"] = "custom"


InputSpec = Annotated[Union[RandomInput, ScalarInput, SafetensorsInput, CustomInput], Field(discriminator="type")]


class ToleranceSpec(_Strict):
    max_atol: float = 1e-2
    max_rtol: float = 1e-2
    required_matched_ratio: float = 0.99
    max_error_cap: float | None = None
    allow_negative_inf: bool = False


class TraceWorkload(_Strict):
    uuid: NonEmpty
    axes: dict[str, Annotated[int, Field(ge=0)]]
    inputs: dict[str, InputSpec]
    tolerance: ToleranceSpec = Field(default_factory=ToleranceSpec)

    @model_validator(mode="after")
    def _custom_all_or_nothing(self) -> "TraceWorkload":
        kinds = {isinstance(s, CustomInput) for s in self.inputs.values()}
        if kinds == {True, False}:
            raise ValueError("a workload cannot mix custom and non-custom inputs")
        return self


class Correctness(_Strict):
    max_relative_error: float = Field(default=0.0, ge=0)
    max_absolute_error: float = Field(default=0.0, ge=0)
    has_nan: bool = False
    has_inf: bool = False
    extra: dict[str, Any] | None = None


class Performance(_Strict):
    latency_ms: float = Field(default=0.0, ge=0)
    reference_latency_ms: float = Field(default=0.0, ge=0)
    speedup_factor: float = Field(default=0.0, ge=0)


class Environment(_Strict):
    hardware: NonEmpty
    libs: dict[str, str] = Field(default_factory=dict)


class Evaluation(_Strict):
    status: Status
    environment: Environment
    timestamp: NonEmpty
    log: str = ""
    correctness: Correctness | None = None
    performance: Performance | None = None

    @model_validator(mode="after")
    def _nullable_table(self) -> "Evaluation":
        needs_correctness = self.status in ("PASSED", "INCORRECT_NUMERICAL")
        needs_performance = self.status == "PASSED"
        if needs_correctness != (self.correctness is not None):
            raise ValueError(
                f"status {self.status}: correctness must be {'present' if needs_correctness else 'absent'}"
            )
        if needs_performance != (self.performance is not None):
            raise ValueError(
                f"status {self.status}: performance must be {'present' if needs_performance else 'absent'}"
            )
        return self


class Trace(_Strict):
    definition: NonEmpty
    workload: TraceWorkload
    solution: str | None = None
    evaluation: Evaluation | None = None

    def to_line(self) -> str:
        """One line of a trace JSONL file (NaN and infinities refused, as upstream writes)."""
        import json

        return json.dumps(self.model_dump(mode="json"), allow_nan=False)
