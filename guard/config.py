"""Thresholds and limits of the guard. Defaults are the documented ones; a workspace may
override them in ``config.json`` and the command line or server may override those."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class GuardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Decision
    noise_floor: float = Field(0.01, ge=0, description="ACCEPT needs at least this speedup")
    noise_sigmas: float = Field(3.0, ge=0, description="threshold in standard errors of the medians")
    rel_se_cap: float = Field(
        0.1,
        gt=0,
        description="the most a median's relative standard error counts in a threshold: the figure "
        "comes from the candidate's process (an incumbent that reported 1000 blocked every challenger)",
    )
    pairing_band_gpu: float = Field(
        1.3,
        gt=1,
        description="an ACCEPT or REVERT against a stored measurement with a speedup inside "
        "[1/band, band] is re-measured side by side with the incumbent (GPU timing)",
    )
    pairing_band_cpu: float = Field(
        2.5,
        gt=1,
        description="the same band for CPU timing, whose windows differ far more "
        "(1.8x between two windows of one kernel was seen on a 2-core machine)",
    )
    pairing_min_dof: int = Field(
        8,
        ge=1,
        description="a paired re-measurement repeats the turns until its noise estimate has at least "
        "this many degrees of freedom (one per repetition and workload, less one per workload): "
        "10 turns each for a one-workload problem, 4 for 3-4 workloads, 2 from 8 workloads",
    )
    redraft_after: int = Field(5, ge=1, description="non-improving evaluations before a redraft")
    stop_sol_fraction: float = Field(0.9, gt=0, le=1.0)
    max_attempts: int | None = Field(None, ge=1, description="per agent and problem")
    time_budget_s: float | None = Field(None, gt=0, description="per agent and problem")
    max_queued_per_agent: int = Field(
        4,
        ge=1,
        description="jobs one agent may have queued or being judged at once; a submission beyond "
        "is refused, so that no agent can fill the queue ahead of the others",
    )
    max_stored_bytes_per_agent: int = Field(
        64_000_000,
        gt=0,
        description="what one agent's submissions (solutions and notes) may take in the workspace "
        "database, in bytes; a submission beyond is refused (each is stored with its verdict)",
    )

    # Correctness
    correctness_rounds: int = Field(3, ge=1, description="random rounds per visible workload")
    heldout_rounds: int = Field(2, ge=1)
    cpu_workloads: int = Field(
        4,
        ge=1,
        description="CPU: the visible workloads judged per problem, small versions of the problem's, "
        "smallest first (fewer: quicker verdicts on fewer shapes)",
    )
    adversarial_rounds: bool = True
    check_determinism: bool = True
    static_screen: bool = True  # tests switch it off to exercise the runtime defences alone
    # Memory (docs/kernelbench.md): how much of a workload's outputs the workers hold at once
    held_rounds_bytes: int = Field(
        64 << 20,
        ge=0,
        description="rounds of one workload judged together while their reference outputs "
        "fit in this many bytes; a workload whose outputs are larger goes one round at a time",
    )
    overlap_rounds_bytes: int = Field(
        1 << 30,
        ge=0,
        description="groups of rounds whose outputs are at most this large overlap: the candidate's "
        "worker runs the next group while the trusted worker compares the last (which then holds "
        "the references of both); larger groups take turns, so that a large problem's two workers "
        "never peak at once (0: always take turns)",
    )
    compare_chunk_elements: int = Field(
        1 << 20,
        ge=1,
        description="elements compared (widened to float64) at a time on a GPU: bounds a "
        "comparison's working memory whatever the output's size",
    )
    cpu_compare_chunk_elements: int = Field(
        1 << 18,
        ge=1,
        description="the same on the CPU, smaller: there the chunk's temporaries come from the C "
        "heap, which fragments, and 1M elements held 119 to 160 MiB (about 60 planned) where 256K "
        "held 38 to 43 MiB, at the same speed (docs/kernelbench.md, 'Memory')",
    )

    # Timing
    min_iters: int = Field(50, ge=1)
    max_iters: int = Field(
        50,
        ge=1,
        description="timed calls per workload at most; each loop (the timed one and the outside clock's "
        "two) runs this many: 500 cost a warm verdict of 16 workloads 28 s of loops on the H200 "
        "(docs/benchmarks.md, session 12), 100 took it to 13.8-14.0 s and 50 to 11.7 s on an H100, "
        "and 27 resubmissions of an incumbent at 50 gave no false ACCEPT, their geomean's CV 0.145% "
        "against 0.140% at 100 (session 41)",
    )
    target_time_s: float = Field(0.2, gt=0, description="timed seconds per workload")
    warmup_time_s: float = Field(0.05, ge=0)
    max_timing_s: float = Field(20.0, gt=0, description="cap on one workload's timed loop")
    replay_checks: int = Field(
        16,
        ge=1,
        description="timed calls per workload whose output digests are checked against the "
        "reference on their own inputs, chosen at random after the loop from every call's digest",
    )
    audits: int | None = Field(
        None, description="no longer used (see replay_checks); kept so older config.json files still load"
    )
    # The outside clock (guard/outside_clock.py): the guard's own clock around the candidate's
    # loop of calls, less the trusted worker's loop without the call, may exceed the median the
    # candidate's process reported by rel * median + abs + slack * (the loop's own cost per
    # call); more is REWARD_HACK. The bands are what honest kernels needed on the H200
    # (docs/guard.md, docs/benchmarks.md).
    outside_rel_band: float = Field(0.10, ge=0, description="relative part of the band, GPU")
    outside_abs_band_ms: float = Field(
        0.01,
        ge=0,
        description="absolute part of the band, GPU, when the loop's draws and digests are "
        "captured graphs and padding lets the device set the pace",
    )
    outside_loop_slack: float = Field(
        0.25,
        ge=0,
        description="the band's share of the loop's own cost per call (padding, draws, "
        "digests, the trusted loop's in the same window), GPU, captured loop: honest excess reached 0.13 of it on "
        "the H200 (2026-12-01, run 5)",
    )
    outside_abs_band_ms_host: float = Field(
        0.05,
        ge=0,
        description="absolute part of the band, GPU, when a custom input generator makes the loop eager and host-bound",
    )
    outside_loop_slack_host: float = Field(
        1.5, ge=0, description="the band's share of the loop's own cost per call, GPU, eager loop"
    )
    outside_windows: int = Field(
        2,
        ge=1,
        description="most windows of the outside clock per workload on a GPU, each on new data; the "
        "shortest of the candidate's and of the trusted loop's are compared (pauses only lengthen a window)",
    )
    outside_windows_first: int = Field(
        1,
        ge=1,
        description="windows always run (GPU and CPU); the next, up to outside_windows(_cpu), only while "
        "the outside clock contradicts the candidate's figure: a pause that lengthened a window gets "
        "another try, an honest figure confirmed at once costs no more windows",
    )
    outside_windows_cpu: int = Field(
        3,
        ge=1,
        description="the same on the CPU: the band allows for a busy machine, but not for a window "
        "stalled whole (an honest candidate's window took 40x its calls' time once on a 2-core "
        "machine at load 6, right after another candidate was killed for its memory: "
        "REWARD_HACK with one window); more windows run only while the figure is contradicted",
    )
    drain_wait_s: float = Field(
        10.0,
        ge=0,
        description="how long the guard waits for the device to become idle before timing its "
        "own loop while the candidate's processes are stopped (GPU)",
    )
    drain_factor: float = Field(
        1.3,
        gt=1,
        description="a flush pass slower than this many times the trusted worker's idle "
        "calibration means other work is running on the device",
    )
    confirm_pad_max_ms: float = Field(
        0.15,
        ge=0,
        description="cap on the device work queued before each iteration of the outside "
        "clock's loop (1.25 x the host's time to enqueue one, as measured at warm-up)",
    )
    outside_window_s_host: float = Field(
        0.0,
        ge=0,
        description="GPU, a host-bound loop (whose outside figure floors the decided one): the shortest "
        "window of the outside clock, planned from the candidate's host time per iteration (0: the "
        "timed loop's calls, as before). Such a figure is the difference of two host-paced walls; over "
        "the timed loop's 50 calls of a 10 us kernel (windows of 15 ms) a 10 us Triton call was floored "
        "at 19 us on an H100 (session 51). Off until measured on a GPU: 0.05 is the value to try",
    )
    outside_calls_most_host: int = Field(
        400,
        ge=0,
        le=4096,
        description="GPU, a host-bound loop: the most calls of an outside clock's window where the timed "
        "loop ran fewer (the candidate's loop is made for as many at warm-up: its digests' positions, "
        "some 20 us a call to draw)",
    )
    confirm_held_max_bytes: int = Field(
        256 << 20,
        ge=0,
        description="CPU: the most bytes of inputs (a set per call, written by the guard) and outputs "
        "(held for the guard to read) the outside clock's loop keeps in the candidate's worker (its calls "
        "are cut to fit, two at least); also the most bytes of outputs the timed loop holds, which cuts its "
        "calls below max_iters for outputs over a fiftieth of it (5 MiB: two calls from 128 MiB)",
    )
    confirm_held_max_calls: int = Field(
        4096, ge=2, description="CPU: the most calls an outside clock's loop runs (and holds the outputs of)"
    )
    outside_window_s_cpu: float = Field(
        0.05,
        ge=0,
        description="CPU: the shortest window of the outside clock's loop; a first window shorter than "
        "this sets the calls per window for the rest (a window's own fixed cost, the requests and the "
        "stop, is milliseconds that vary: over a few calls it swamped them)",
    )
    outside_paced_share_cpu: float = Field(
        0.5,
        ge=0,
        le=1,
        description="CPU: the share of a paced window's figure (each call's inputs written once the call "
        "before it is done) that floors the decided figure beside the outside clock's: a paced call runs "
        "cold, 1.3-2.2x an honest small call's median on a 2-core machine; batching a window's calls, "
        "which the unpaced windows cannot see, cannot shorten it (0: no paced window)",
    )
    outside_paced_loops_cpu: int = Field(
        3,
        ge=1,
        description="CPU: the trusted worker's loops after the paced window, on its inputs, the "
        "shortest subtracted: with one, a loop that the machine's other work slowed made an honest "
        "paced figure -0.016 ms (session 36's red team), which floored nothing",
    )
    outside_rel_band_cpu: float = Field(1.0, ge=0, description="relative part of the band, CPU")
    outside_abs_band_ms_cpu: float = Field(5.0, ge=0, description="absolute part of the band, CPU")
    outside_loop_slack_cpu: float = Field(
        2.0,
        ge=0,
        description="the band's share of the loop's own cost per call, CPU, where a loaded "
        "machine made one window up to three times slower than the next",
    )
    compile_baseline: bool = True
    compile_mode: str = "default"

    # Limits
    call_timeout_s: float = Field(60.0, gt=0, description="one request to a worker")
    build_timeout_s: float = Field(300.0, gt=0)
    max_source_bytes: int = Field(256_000, gt=0)
    max_source_files: int = Field(16, gt=0)
    cpu_memory_limit_gb: float = Field(8.0, gt=0, description="address-space cap of CPU workers")
    host_files_stop_fraction: float | None = Field(
        0.5,
        gt=0,
        le=1,
        description="the host's open-file table's fill at which the candidate worker holding most of it "
        "is stopped (guard/runner/host_files.py; null: not watched)",
    )
    spare_workers_gpu: int = Field(
        3,
        ge=1,
        le=4,
        description="candidate workers a GPU's pool keeps started ahead of their candidates. They start "
        "only once a verdict's timing is over (a start beside it floored honest figures, session 47); a "
        "paired re-measurement takes one for the incumbent, and with a third the next verdict still does "
        "not wait for a start (8.3 s on an H100, session 44). A spare holds no CUDA context (session 46). "
        "A CPU's pool keeps one: a start there slows timing",
    )
    wait_for_starts_before_timing: bool = Field(
        False,
        description="the benchmark waits for starting spare workers before it times anything, so that "
        "no candidate is timed beside a worker's start (a verdict that follows another at once times "
        "its first workloads beside the start of the spare the last one took). Off by default: on an "
        "H100 in session 50, with it on, back-to-back verdicts took 16.7 s (median of 25) against "
        "8.1 s off (session 49), and 3 of 25 still had a floored figure, as 3 of 30 did off. Off, a "
        "floored or contradicted figure is still measured again after the wait "
        "(outside_clock.run_windows). An agent that takes longer than a start to write its next kernel "
        "never waits either way",
    )
    sandbox_tasks_limit: int | None = Field(
        None,
        ge=16,
        description="processes and threads one candidate worker's sandbox may hold, by its pids "
        "cgroup where the guard can make one (None: 1024 + 16 per core)",
    )

    def chunk_elements(self, device_kind: str) -> int:
        """Elements a comparison widens at a time on a device of this kind ("cpu", "cuda")."""
        return self.cpu_compare_chunk_elements if device_kind == "cpu" else self.compare_chunk_elements

    @classmethod
    def load(cls, path: Path | None, **overrides: Any) -> "GuardConfig":
        """The workspace's ``config.json`` (at ``path``, if there is one) with ``overrides`` on
        top. ValueError naming the file and each setting that is not valid, and for an override
        that it came from the caller (a command's option, say), not from the file."""
        data: dict[str, Any] = {}
        if path is not None and path.is_file():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: not valid JSON: {exc}") from None
            if not isinstance(data, dict):
                raise ValueError(f"{path}: should hold one JSON object of settings, not {type(data).__name__}")
        given = {k: v for k, v in overrides.items() if v is not None}
        data.update(given)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            where = str(path) if path is not None else "the guard's settings"
            bad = []
            for err in exc.errors():
                name = ".".join(str(x) for x in err["loc"]) or "(settings)"
                origin = " (given as an override, not in the file)" if err["loc"] and err["loc"][0] in given else ""
                bad.append(f"{name}: {err['msg']}{origin}")
            raise ValueError(f"{where}: " + "; ".join(bad)) from None
