"""A reference's failure in the trusted worker: its own, or the device's state
(``runner/reference_failures.py``).

A reference that refuses float64 leaves an output held to the stated atol, more lenient than
the held one, and a round the reference cannot run is skipped. A run that fails for the
device's state (its memory, which the candidate's worker shares on a GPU) must never read as
either: a candidate holding the device's memory while the guard works would turn the held atol
off, or have its held-out rounds skipped (review, session 39).
"""

from __future__ import annotations

import pytest
import torch

from guard.runner.reference_failures import (
    ReferenceUnavailable,
    despite_device_state,
    device_state_failure,
    float64_or_refusal,
)

CUBLAS_STARVED = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError(CUBLAS_STARVED),
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"),
        RuntimeError("CUDA driver error: out of memory"),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"
        ),
    ],
)
def test_failures_of_the_devices_state_are_told_apart(exc):
    assert device_state_failure(exc)


@pytest.mark.parametrize(
    "exc",
    [
        AssertionError("this reference runs in float32 only"),
        RuntimeError("\"addmm_cuda\" not implemented for 'Double'"),
        TypeError("expected BFloat16 but found Double"),
        NotImplementedError("no double kernel"),
    ],
)
def test_a_references_own_refusal_is_not_the_devices_state(exc):
    assert not device_state_failure(exc)


def test_a_refusal_is_none_and_runs_once():
    calls = []

    def refuses():
        calls.append(1)
        raise AssertionError("float32 only")

    assert float64_or_refusal(refuses, lambda: None) is None
    assert len(calls) == 1


def test_memory_that_comes_back_gives_the_answer():
    freed, tries = [], []

    def starved_once():
        tries.append(1)
        if len(tries) == 1 and not freed:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return [torch.ones(2, dtype=torch.float64)]

    got = float64_or_refusal(starved_once, lambda: freed.append(1))
    assert got is not None and torch.equal(got[0], torch.ones(2, dtype=torch.float64))
    assert freed == [1] and len(tries) == 2


@pytest.mark.parametrize("second", [RuntimeError(CUBLAS_STARVED), AssertionError("float32 only")])
def test_a_device_that_stays_starved_raises_and_never_reads_as_a_refusal(second):
    failures = [RuntimeError(CUBLAS_STARVED), second]

    def starved():
        raise failures.pop(0)

    with pytest.raises(ReferenceUnavailable, match="not made"):
        float64_or_refusal(starved, lambda: None)


# y = x.sum(-1) * 1e-6 for x ~ N(0, 1) over 256 columns: outputs of RMS about 1.6e-5, far below
# float32's stated atol (1e-4), so zeros pass the stated tolerance and fail the held one. The
# float64 run fails as cuBLAS does on a device whose memory another process holds.
STARVED_IN_FLOAT64 = f"""import torch


def run(x):
    if x.dtype == torch.float64:
        raise RuntimeError({CUBLAS_STARVED!r})
    return x.sum(-1) * 1e-6
"""
ZEROS = """import torch


def run(x):
    return torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
"""


def test_zeros_are_not_passed_when_the_float64_run_is_starved(tmp_path):
    """Through the whole guard: the held atol rejects zeros, the float64 run that would
    decide fails as a starved device's does, and the guard withholds the verdict (a guard
    error, the candidate's state "error") instead of falling back to the stated atol, under
    which zeros pass."""
    from guard.candidates.load import from_source
    from guard.cascade import GuardError

    from helpers import make_guard, row_problem_folder, unique

    folder = row_problem_folder(tmp_path, "small_sums", STARVED_IN_FLOAT64, 256, reduce=True)
    g = make_guard(tmp_path / "ws", correctness_rounds=1, heldout_rounds=1)
    try:
        g.store.import_path(folder)
        with pytest.raises(GuardError, match="comparison failed"):
            g.evaluate(from_source(unique(ZEROS), "pytorch", "kernel.py"), "small_sums", agent="a")
        states = [row["state"] for row in g.db.query("SELECT state FROM candidates")]
        assert states == ["error"]
    finally:
        g.close()


def test_the_references_own_failure_propagates_untouched():
    calls = []

    def own():
        calls.append(1)
        raise ValueError("this reference takes no such input")

    with pytest.raises(ValueError, match="no such input"):
        despite_device_state(own, lambda: None, "the reference")
    assert len(calls) == 1


# a reference that fails on the "tiny" round only: as a starved device's cuBLAS does, or by
# its own code (an op that refuses such values)
FAILS_ON_TINY = """import torch


def run(x):
    if x.abs().max() < 1e-6:
        raise {error}
    return torch.nn.functional.silu(x)
"""
SILU = """import torch


def run(x):
    return x * torch.sigmoid(x)
"""


@pytest.mark.parametrize(
    "error, skipped",
    [(f"RuntimeError({CUBLAS_STARVED!r})", False), ("ValueError('no tiny inputs here')", True)],
    ids=["device_state", "own"],
)
def test_a_round_is_skipped_for_the_references_own_failure_only(tmp_path, error, skipped):
    """A round whose reference fails by its own code is skipped, as before; one whose
    reference fails as a starved device's does ends the evaluation as a guard error: a
    candidate holding the device's memory must not have its rounds skipped."""
    from guard.candidates.load import from_source
    from guard.cascade import GuardError

    from helpers import make_guard, row_problem_folder, unique

    folder = row_problem_folder(tmp_path, "silu_rows", FAILS_ON_TINY.format(error=error), 64, False, True)
    g = make_guard(tmp_path / "ws", correctness_rounds=4, heldout_rounds=1)
    try:
        g.store.import_path(folder)
        candidate = from_source(unique(SILU), "pytorch", "kernel.py")
        if skipped:
            v = g.evaluate(candidate, "silu_rows", agent="a")
            assert v.status == "PASSED", v.reason
            assert v.checked.rounds_skipped > 0
        else:
            with pytest.raises(GuardError, match="could not make the references"):
                g.evaluate(candidate, "silu_rows", agent="a")
    finally:
        g.close()
