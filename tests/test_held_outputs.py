"""A CPU's outside-clock loop gets its calls' inputs written into the candidate's worker by the
guard (``runner/staged.py``, ``runner/poke.py``, ``guard/cascade/staged_inputs.py``), holds its
calls' outputs there, and the guard reads the chosen ones out of the worker's memory
(``runner/kept.py``, ``runner/peek.py``, ``guard/cascade/held_outputs.py``): nothing is drawn,
digested or copied in the candidate's process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from guard.cascade import held_outputs, staged_inputs  # noqa: E402
from guard.cascade.reasons import Rejection  # noqa: E402
from guard.problems.schema import Definition, Workload  # noqa: E402
from guard.runner import messages as m  # noqa: E402
from guard.runner import replays  # noqa: E402
from guard.runner.confirm import ConfirmLoop, pack_outputs  # noqa: E402
from guard.runner.inputs import InputMaker  # noqa: E402
from guard.runner.kept import KeptOutputs  # noqa: E402
from guard.runner.pacing import unpack  # noqa: E402
from guard.runner.peek import PeekError, process_with_ns_pid, read_held, span_elements  # noqa: E402
from guard.runner.poke import Memory  # noqa: E402
from guard.runner.refill import Refiller  # noqa: E402
from guard.runner.staged import StagedInputs, draw_to_file  # noqa: E402
from guard.runner.tensorio import read_tensor  # noqa: E402

from helpers import SCALE_DEF  # noqa: E402

DEF = SCALE_DEF
EXPECTED = [([4, 64], "float32")]


def _loop(kept, sets, static=None, rows=8, own=True):
    """A CPU's loop: the candidate's (``own`` staged buffers, ``kept``) or the trusted one."""
    refiller = Refiller(InputMaker(DEF, "cpu"), {}, {"n": 4})
    staged = StagedInputs(sets, own=own)
    return ConfirmLoop("cpu", sets, refiller, static, rows, lambda p: None, kept=kept, staged=staged)


W = Workload.model_validate({"axes": {"n": 4}, "uuid": "w"})


def _stage(loop, seed, iters, tmp_path):
    """As the guard stages a window: the trusted loop's draws into a file, checked against the
    buffers the candidate's loop names, written into them (here: this very process; every
    call's at once, where the guard writes each when the call before it is done)."""
    drawn = draw_to_file(_loop(None, _sets(), own=False).inputs_at(seed, list(range(iters))), tmp_path / "in.bin")
    writes = staged_inputs.planned_writes(loop.staged.describe(iters), drawn, iters, _refused)
    with Memory(os.getpid()) as memory:
        for call in writes:
            memory.write((tmp_path / "in.bin").read_bytes(), call)


def _refused(why):
    return Rejection("benchmark", "REWARD_HACK", why, None, "w")


def _held(kept, it):
    """Where call ``it``'s outputs lie, as its DONE tells the guard (``runner/pacing.py``)."""
    outputs = unpack(pack_outputs(kept.held[it], [2]), [2])
    return held_outputs.described(outputs, EXPECTED)


def _sets(n=2):
    maker = InputMaker(DEF, "cpu")
    return [maker.make({}, {"n": 4}, seed=s) for s in range(1, n + 1)]


def _read_back(held, tmp_path, tag="c"):
    """What the guard reads at ``held``'s addresses in this very process."""
    pid = process_with_ns_pid(os.getpid(), os.getpid())
    out = read_held(pid, held, EXPECTED, tmp_path, tag)
    tensors = []
    for r in out:
        flat = read_tensor({"file": r.file, "shape": [r.span], "dtype": r.dtype}, "cpu")
        tensors.append(flat.as_strided(r.shape, r.stride))
    return tensors


def test_eager_outputs_are_held_where_the_call_left_them_and_read_back(tmp_path):
    sets = _sets()
    kept = KeptOutputs(None, 8)
    loop = _loop(kept, sets)
    returned = []

    def call(k):
        y = sets[k][0] * 2
        returned.append(y)
        return [y]

    _stage(loop, 5, 6, tmp_path)
    assert loop.run(seed=5, iters=6, call=call, pad_passes=0) == []  # no digests: nothing computed in-process
    held = [_held(kept, it) for it in range(6)]
    assert [h[0].address for h in held] == [y.data_ptr() for y in returned]  # no copies either
    # each call's own answer, on its own draw, as the trusted worker replays the draws
    checker = _loop(None, _sets())
    for it, args in checker.inputs_at(5, [0, 3, 5]):
        (got,) = _read_back(held[it], tmp_path, f"i{it}")
        assert torch.equal(got, args[0] * 2)


def test_destination_passing_gets_a_buffer_set_per_call_and_its_own_back(tmp_path):
    sets = _sets()
    dests = [[torch.empty(4, 64)] for _ in sets]
    originals = [d[0] for d in dests]
    kept = KeptOutputs(dests, 8)
    loop = _loop(kept, sets)

    def in_place(k):
        dests[k][0].copy_(sets[k][0] * 2)  # writes where the destination list points now

    _stage(loop, 6, 5, tmp_path)
    loop.run(seed=6, iters=5, call=in_place, pad_passes=0)
    held = [_held(kept, it) for it in range(5)]
    assert len({h[0].address for h in held}) == 5  # never the same buffer twice
    assert [d[0] for d in dests] == originals  # the timed loop's buffers are back
    checker = _loop(None, _sets())
    for it, args in checker.inputs_at(6, [1, 4]):
        (got,) = _read_back(held[it], tmp_path, f"d{it}")
        assert torch.equal(got, args[0] * 2)


def test_the_loops_on_a_cpu_draw_nothing_and_call_on_each_calls_own_inputs(tmp_path):
    """The window holds the calls alone: the candidate's loop calls each call on the set the
    guard wrote for it, and the trusted loop only places its sets; neither draws, and both
    leave the live sets as they were for the timed loop and the checks."""
    sets = _sets()
    before = [s[0].clone() for s in sets]
    _loop(None, sets, own=False).run(seed=7, iters=4, call=None, pad_passes=0)
    assert all(torch.equal(a, s[0]) for a, s in zip(before, sets))  # nothing drawn
    with pytest.raises(RuntimeError, match="hold them"):
        _loop(None, sets, own=False).run(seed=7, iters=2, call=lambda k: [sets[k][0]], pad_passes=0)
    loop = _loop(KeptOutputs(None, 8), sets)
    _stage(loop, 7, 4, tmp_path)
    seen = []
    loop.run(seed=7, iters=4, call=lambda k: seen.append(sets[k][0].clone()) or [sets[k][0]], pad_passes=0)
    drawn = [args[0].clone() for _, args in _loop(None, _sets(), own=False).inputs_at(7, [0, 1, 2, 3])]
    assert all(torch.equal(a, b) for a, b in zip(seen, drawn)) and len(seen) == 4
    assert all(torch.equal(a, s[0]) for a, s in zip(before, sets))  # the live sets are back
    unstaged = ConfirmLoop("cpu", sets, loop.refiller, None, 8, lambda p: None, kept=KeptOutputs(None, 8))
    with pytest.raises(RuntimeError, match="inputs staged"):
        unstaged.run(seed=7, iters=2, call=lambda k: [sets[k][0]], pad_passes=0)


def test_buffers_the_candidate_names_wrongly_are_refused_before_anything_is_written(tmp_path):
    """The candidate's worker names where each call's inputs go; one buffer for every call
    (each call would then see the last call's inputs), a buffer of another shape, dtype or
    layout, or a count that is not the window's, is its doing: REWARD_HACK."""
    loop = _loop(KeptOutputs(None, 8), _sets())
    good = loop.staged.describe(3)
    drawn = draw_to_file(_loop(None, _sets(), own=False).inputs_at(1, [0, 1, 2]), tmp_path / "in.bin")
    assert [len(call) for call in staged_inputs.planned_writes(good, drawn, 3, _refused)] == [1, 1, 1]
    first = good[0][0]
    cases = {
        "overlap": [[first], [first], good[2]],
        "shape": [[first.model_copy(update={"shape": [4, 32]})], *good[1:]],
        "dtype": [[first.model_copy(update={"dtype": "float16"})], *good[1:]],
        "layout": [[first.model_copy(update={"stride": [1, 4]})], *good[1:]],
        "missing": [[None], *good[1:]],
        "count": good[:2],
    }
    for why, named in cases.items():
        with pytest.raises(Rejection) as caught:
            staged_inputs.planned_writes(named, drawn, 3, _refused)
        assert caught.value.status == "REWARD_HACK", why


def test_a_buffer_that_is_not_writable_is_found(tmp_path):
    path = tmp_path / "in.bin"
    path.write_bytes(bytes(64))
    with Memory(os.getpid()) as memory, pytest.raises(PeekError, match="nothing writable"):
        memory.write(path.read_bytes(), [(8, 0, 64)])  # nothing mapped at address 8


def test_a_stale_answer_read_back_fails_the_digest_check(tmp_path):
    """A loop that answers only every other call (pointing the rest at the last answer, or at a
    copy of it) is found: what the guard reads is checked against the reference on that call's
    inputs."""
    sets = _sets()
    kept = KeptOutputs(None, 8)
    loop = _loop(kept, sets)
    last = []

    def lazy(k):
        if not last or len(kept.held) % 2 == 0:
            last[:] = [sets[k][0] * 2]
            return list(last)
        return list(last) if len(kept.held) % 4 == 1 else [last[0].clone()]

    _stage(loop, 8, 4, tmp_path)
    loop.run(seed=8, iters=4, call=lazy, pad_passes=0)
    held = [_held(kept, it) for it in range(4)]
    projection = replays.Projection(3)
    checker = _loop(None, _sets())
    for it, args in checker.inputs_at(8, [1]):
        (got,) = _read_back(held[it], tmp_path)
        values, allow = replays.digest_bounds(args[0] * 2, 1e-3, 1e-3, projection, call=it)
        mine = replays.digest([got], projection, it)[0].tolist()
        assert replays.digest_mismatch(mine, values, allow, "y") is not None


def test_descriptions_that_reach_beyond_an_output_are_refused_before_reading(tmp_path):
    y = torch.ones(4, 64)
    pid = os.getpid()
    good = m.HeldOutput(address=y.data_ptr(), shape=[4, 64], stride=[64, 1], dtype="float32")
    assert read_held(pid, [good], EXPECTED, tmp_path, "ok")[0].span == 256
    cases = {
        "shape": good.model_copy(update={"shape": [8, 64]}),
        "dtype": good.model_copy(update={"dtype": "float64"}),
        # a gigabyte from 256 floats, in runs of one (rows far apart are read alone: below)
        "strides": good.model_copy(update={"stride": [1, 1 << 20]}),
        "readable": good.model_copy(update={"address": 8}),  # nothing mapped there
    }
    for why, h in cases.items():
        with pytest.raises(PeekError):
            read_held(pid, [h], EXPECTED, tmp_path, why)
    with pytest.raises(PeekError):
        read_held(pid, [good, good], EXPECTED, tmp_path, "count")
    assert span_elements([3, 0], [1, 1]) == 0 and span_elements([2, 3], [3, 1]) == 6


def test_the_guard_reads_a_stopped_child_processes_memory(tmp_path):
    """The guard's real case: another process (here a child, as a worker is), found by the id
    its PID namespace gives it, read while it is stopped."""
    code = (
        "import ctypes, sys, os\n"
        "import torch\n"
        "y = torch.arange(256, dtype=torch.float32).reshape(4, 64)\n"
        "print(os.getpid(), y.data_ptr(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ns_pid, address = (int(v) for v in child.stdout.readline().split())
        os.kill(child.pid, signal.SIGSTOP)
        pid = process_with_ns_pid(child.pid, ns_pid)
        held = [m.HeldOutput(address=address, shape=[4, 64], stride=[64, 1], dtype="float32")]
        (r,) = read_held(pid, held, EXPECTED, tmp_path, "child")
        got = read_tensor({"file": r.file, "shape": [r.span], "dtype": r.dtype}, "cpu").reshape(4, 64)
        assert torch.equal(got, torch.arange(256, dtype=torch.float32).reshape(4, 64))
        with pytest.raises(PeekError, match="not in its tree"):
            process_with_ns_pid(child.pid, 999_999_999)
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()


def test_calls_per_window_fit_the_memory_and_lengthen_short_windows():
    d = Definition.model_validate(DEF)
    w = Workload.model_validate({"axes": {"n": 4}, "uuid": "w"})  # 1 KiB of input and of output a call
    assert held_outputs.held_calls(d, w, 128 << 10, 4096) == 64  # and 1 KiB of input
    assert held_outputs.held_calls(d, w, 100, 4096) == held_outputs.MIN_HELD_CALLS
    assert held_outputs.held_calls(d, w, 1 << 30, 500) == 500
    # a 5 ms window of 10 calls: 10 ms wanted, with a fifth to spare
    assert held_outputs.calls_for_window(10, 0.005, 0.01, 1000) == 24
    assert held_outputs.calls_for_window(10, 0.02, 0.01, 1000) == 10  # long enough already
    assert held_outputs.calls_for_window(10, 0.0, 0.01, 100) == 100  # never past the cap


def test_the_timed_loop_holds_as_many_calls_as_fit_by_their_outputs_alone():
    """A CPU's timed loop holds every call's outputs until the guard has read the ones it
    checks (``timed_reads``): its count comes down to what fits, inputs not counted (they
    rotate over the live sets), two at least; the bounds the plan is checked against too."""
    d = Definition.model_validate(DEF)
    w = Workload.model_validate({"axes": {"n": 4}, "uuid": "w"})  # 1 KiB of output a call
    timing = m.TimingConfig(min_iters=50, max_iters=50, target_time_s=0.2, warmup_time_s=0.05)
    assert held_outputs.timed_calls_capped(timing, d, w, 1 << 20) == timing  # 1024 fit
    capped = held_outputs.timed_calls_capped(timing, d, w, 20 << 10)
    assert (capped.min_iters, capped.max_iters) == (20, 20)
    least = held_outputs.timed_calls_capped(timing, d, w, 100)
    assert (least.min_iters, least.max_iters) == (held_outputs.MIN_HELD_CALLS, held_outputs.MIN_HELD_CALLS)
    few = m.TimingConfig(min_iters=1, max_iters=3, target_time_s=0.2, warmup_time_s=0.05)
    assert held_outputs.timed_calls_capped(few, d, w, 100) == few.model_copy(update={"max_iters": 2})


def test_the_timed_loop_holds_a_copy_of_what_each_call_returned(tmp_path):
    """Holding a timed call's outputs as they lie lost them (red team, session 48): a kernel
    that computes every call into the same buffer, or returns a view of its input (which the
    next refill changes), had a later call's values read for an earlier one, and a slice of a
    wider buffer spans more than the guard reads whole: honest kernels were REWARD_HACK. The
    timed loop holds a dense copy made right after each call (no call's cost: calls are timed
    one at a time), and the guard reads each call's own answer."""
    sets = _sets()
    kept = KeptOutputs(None, 4)
    same = torch.empty(4, 64)
    wide = torch.empty(4, 3 * 64)
    answers = []
    for it in range(3):
        x = sets[it % 2][0]
        same.copy_(x * (it + 1))
        wide[:, 64:128] = x * (it + 1)
        answers.append([x * (it + 1), x * (it + 1), x.clone()])
        kept.take(it, [same, wide[:, 64:128], x.view(4, 64)], copy=True)
        x.normal_()  # the next refill of that set
    for it, (row, shown) in enumerate(zip(kept.held, kept.described())):
        for j, (t, h) in enumerate(zip(row, shown)):
            assert t.is_contiguous() and torch.equal(t, answers[it][j])
            (got,) = _read_back([h], tmp_path, f"t{it}_{j}")
            assert torch.equal(got, answers[it][j])
    kept.take(3, [3.0, same], copy=True)  # not a tensor: nothing to read there
    assert kept.described()[3][0] is None


def test_a_window_reads_a_slice_of_a_wider_buffer_whole_or_by_rows(tmp_path):
    """In an outside clock's window a copy would be the candidate's cost, and one it could skip,
    so outputs are held as they lie. A slice of a wider buffer (an honest kernel's: one third of
    a fused projection's rows) spans more than the guard reads whole and was REWARD_HACK (red
    team, session 48): read whole up to four times its size, else its rows one at a time, its
    elements and nothing between. A sparse layout of a small buffer (a column) is read whole;
    one of a large buffer has no rows to read: refused as before, as are strides that the
    shape does not have."""
    kept = KeptOutputs(None, 4)
    fused = torch.randn(4, 3 * 64)  # a third of it: read whole
    wide = torch.randn(4, 1 << 21)  # rows 8 MiB apart: too wide to read whole, read by rows
    kept.take(0, [fused[:, 64:128]])
    kept.take(1, [wide[:, 64:128]])
    for it, want in enumerate((fused[:, 64:128], wide[:, 64:128])):
        (got,) = _read_back(kept.described()[it], tmp_path, f"slice{it}")
        assert torch.equal(got, want)
    pid = process_with_ns_pid(os.getpid(), os.getpid())
    (by_rows,) = read_held(pid, kept.described()[1], EXPECTED, tmp_path, "dense")
    assert by_rows is not None and by_rows.span == 256 and os.path.getsize(by_rows.file) == 256 * 4
    with pytest.raises(PeekError):  # the timed loop's outputs are dense copies: no rows asked
        read_held(pid, kept.described()[1], EXPECTED, tmp_path, "timed", rows=False)
    column = torch.randn(64, 8)  # a small wider buffer: its column read whole, however sparse
    (col,) = read_held(
        pid,
        [m.HeldOutput(address=column.data_ptr(), shape=[4, 64], stride=[1, 8], dtype="float32")],
        EXPECTED,
        tmp_path,
        "col",
    )
    assert col is not None and col.span == 1 + 3 + 63 * 8
    big = torch.empty(1 << 23)  # 32 MiB: a sparse layout over it has no rows and is too wide to read whole
    narrow = m.HeldOutput(address=big.data_ptr(), shape=[4, 64], stride=[1, 1 << 17], dtype="float32")
    with pytest.raises(PeekError, match="runs of at least"):
        read_held(pid, [narrow], EXPECTED, tmp_path, "cols")
    extra = m.HeldOutput(address=wide.data_ptr(), shape=[4, 64], stride=[512, 1, 7], dtype="float32")
    with pytest.raises(PeekError, match="3 strides"):
        read_held(pid, [extra], EXPECTED, tmp_path, "extra")


def test_memory_returned_again_for_the_next_call_is_named_before_timing():
    """A kernel that computes every call into one buffer it keeps loses each answer to the next
    call: a CPU's loops, which hold every call's outputs for the guard to read, read a later
    answer for an earlier call, and the honest kernel was REWARD_HACK, "behaves differently
    while timed" (red team, session 48). The correctness gate now names it, from the bytes of
    the earlier rounds' outputs, held meanwhile. Not it: new memory; two outputs of one call
    sharing memory (an output in an input's memory is refused earlier, by ``_call``); two empty
    outputs (every empty storage lies at address 0: a review of ours, session 48); a new slice
    of one arena for every call (its storage is the same, its elements are not: the second red
    team, session 48, whose honest arena kernel was INCORRECT_NUMERICAL); two interleaved
    column slices of one buffer (session 49)."""
    from guard.runner.candidate_role import _returned_again

    kept = torch.empty(4, 64)
    names = ["y", "z"]
    assert "'y'" in _returned_again(names, [kept, torch.empty(3)], [kept, torch.empty(3)])
    assert "'y'" in _returned_again(names, [kept[1:], torch.empty(3)], [kept, torch.empty(3)])
    assert _returned_again(names, [torch.empty(4, 64), torch.empty(3)], [kept, torch.empty(3)]) is None
    assert _returned_again(names, [kept, kept[0]], [torch.empty(4, 64), torch.empty(3)]) is None
    assert _returned_again(names, [torch.empty(0, 64), torch.empty(0)], [torch.empty(0, 64), torch.empty(0)]) is None
    arena = torch.empty(4 * 256 + 3)
    first, second = arena[:256].view(4, 64), arena[256:512].view(4, 64)
    assert _returned_again(names, [second, arena[-3:]], [first, arena[512:515]]) is None
    assert "'y'" in _returned_again(names, [arena[255:511].view(4, 64), arena[-3:]], [first, arena[512:515]])
    # two column slices of one wide buffer interleave without sharing an element (session 49)
    wide = torch.empty(4, 128)
    assert _returned_again(names, [wide[:, 64:], torch.empty(3)], [wide[:, :64], torch.empty(3)]) is None


def test_a_description_past_any_address_or_stride_is_the_candidates_fault(tmp_path):
    """An address of 2**63 raised an OverflowError in the guard's read and withheld the verdict;
    a stride of 2**64 on a dimension of size 1 passed the span check and failed torch's view in
    the trusted worker as the guard's own error (red team, session 48). The message refuses
    both out of protocol; the read refuses what gets past it as the candidate's doing, and the
    strides of dimensions of size 1 address nothing, so they are read as contiguous."""
    from pydantic import ValidationError

    fine = {"address": 4096, "shape": [1, 64], "stride": [64, 1], "dtype": "float32"}
    m.HeldOutput.model_validate(fine)
    for bad in ({"address": 2**63}, {"stride": [2**64, 1]}):
        with pytest.raises(ValidationError):
            m.HeldOutput.model_validate(fine | bad)
    y = torch.randn(1, 64)
    h = m.HeldOutput.model_construct(address=m.MEMORY_LIMIT - 8, shape=[1, 64], stride=[64, 1], dtype="float32")
    pid = process_with_ns_pid(os.getpid(), os.getpid())
    with pytest.raises(PeekError):
        read_held(pid, [h], [([1, 64], "float32")], tmp_path, "far")
    odd = m.HeldOutput(address=y.data_ptr(), shape=[1, 64], stride=[2**59, 1], dtype="float32")
    (read,) = read_held(pid, [odd], [([1, 64], "float32")], tmp_path, "unit")
    assert read is not None and read.stride == [64, 1]
    flat = read_tensor({"file": read.file, "shape": [read.span], "dtype": read.dtype}, "cpu")
    assert torch.equal(flat.as_strided(read.shape, read.stride), y)


def test_windows_run_again_when_short_or_when_the_calls_were_lost_in_noise():
    # (calls, shortest window s, outside figure ms, target s, most calls)
    assert held_outputs.longer_windows(10, 0.002, 0.1, 0.01, 1000) == 60  # short: lengthened to the target
    assert held_outputs.longer_windows(10, 0.02, 0.1, 0.01, 1000) is None  # long enough, resolved
    # long enough, but no call cost anything by the guard's clock: a forged median would decide
    assert held_outputs.longer_windows(10, 0.02, 0.0, 0.01, 1000) == 40
    assert held_outputs.longer_windows(10, 0.02, -0.3, 0.01, 25) == 25  # at most the cap
    assert held_outputs.longer_windows(25, 0.02, -0.3, 0.01, 25) is None  # at the cap already


def test_read_outputs_travel_in_the_verify_request():
    r = m.ReadOutput(file="/x/c_0.bin", span=256, shape=[4, 64], stride=[64, 1], dtype="float32")
    msg = m.VerifyReplays(
        key="k",
        workload={},
        axes={},
        sets=[1],
        run_seed=1,
        iterations=[0],
        digests=[],
        tolerances=[],
        names=["y"],
        read=[[r, None]],
    )
    assert m.VerifyReplays.model_validate(msg.model_dump()).read == [[r, None]]
    with pytest.raises(ValueError):
        m.HeldOutput(address=-1, shape=[1], stride=[1], dtype="float32")


def test_read_outputs_are_checked_element_by_element_not_by_digest(tmp_path):
    """An output the guard read out of a CPU loop is held to the reference as a correctness
    round holds it. A result 2% off everywhere (a timed call that skipped its reduction and
    guessed the scale) is well outside a 1e-2 tolerance on the larger elements, yet its sums
    and norms lie within what a digest allows: checked by them it passed (red team, session
    27); element by element it fails, as its digest's sampled elements do. A result that only
    the float64 reference matches passes."""
    from guard.runner import replay_check
    from guard.runner.tensorio import write_tensor

    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(1, 4096, generator=gen)
    tol = [m.Tolerance(atol=1e-2, rtol=1e-2, required_matched_ratio=0.99)]

    def read(t: torch.Tensor, name: str) -> list[m.ReadOutput | None]:
        path = tmp_path / f"{name}.bin"
        write_tensor(t, path)
        return [
            m.ReadOutput(file=str(path), span=t.numel(), shape=list(t.shape), stride=list(t.stride()), dtype="float32")
        ]

    def exact() -> list[torch.Tensor]:
        return [ref.double()]

    off = ref * 1.02
    projection = replays.Projection(5)
    digest_row = [replays.digest([off], projection)[0].tolist()]
    assert "sampled elements" in (
        replay_check.digests_mismatch(digest_row, [ref], tol, ["y"], projection, exact, 0) or ""
    )
    why = replay_check.outputs_mismatch(read(off, "off"), [ref], tol, ["y"], exact)
    assert why is not None and "elements outside atol=0.01 rtol=0.01" in why
    assert replay_check.outputs_mismatch(read(ref.clone(), "same"), [ref], tol, ["y"], exact) is None
    # the reference rounds where the candidate does not: the float64 reference decides
    rounded = ref.to(torch.bfloat16).float()
    strict = [m.Tolerance(atol=0.0, rtol=1e-6)]
    assert replay_check.outputs_mismatch(read(ref.clone(), "exact"), [rounded], strict, ["y"], exact) is None
    assert replay_check.outputs_mismatch([None], [ref], tol, ["y"], exact) == "output 'y': not a tensor"
    assert "2 outputs read, expected 1" in replay_check.outputs_mismatch([None, None], [ref], tol, ["y"], exact)


def test_the_trusted_worker_draws_a_windows_inputs_and_names_buffers_of_its_own(tmp_path):
    """The trusted worker draws every call's inputs of a window into a file, as its checks
    draw them again later, and names buffers of its own for them: the guard writes the same
    bytes into both workers call by call, so both windows pay the writes alike."""
    from guard.problems.derive import workload_set
    from guard.problems.store import load_problem
    from guard.runner import trusted_role as tr
    from seeds import SEEDS_DIR

    prob = load_problem(SEEDS_DIR / "rmsnorm_llama3_8b")
    d = prob.definition
    w = workload_set(prob, "cpu", b"secret").visible[0]
    axes = d.resolve_axes(w.axes)
    role = tr.TrustedRole("cpu", tmp_path)
    key = d.content_hash()
    assert role.handle({"op": "problem", "key": key, "definition": d.to_json(), "blob_root": None})["ok"]
    common = {"key": key, "workload": w.model_dump(mode="json"), "axes": axes, "sets": [1, 2]}
    path = tmp_path / "drawn.bin"
    reply = m.DrawnReply.model_validate(
        role.handle(m.DrawInputs(**common, seed=3, iters=5, path=str(path)).model_dump())
    )
    assert reply.ok and reply.pid == os.getpid() and len(reply.tensors) == len(reply.buffers) == 5
    writes = staged_inputs.planned_writes(reply.buffers, reply.tensors, 5, _refused)
    assert sum(nbytes for call in writes for _, _, nbytes in call) == path.stat().st_size
    # what the file holds is what the checks draw again for those calls
    loop = role._loop[1]
    data = path.read_bytes()
    for it, args in loop.inputs_at(3, [0, 4]):
        for t, drawn in zip(args, reply.tensors[it]):
            if drawn is not None:
                raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                assert raw == data[drawn.offset : drawn.offset + drawn.nbytes]


CUSTOM_REFERENCE = (
    "import torch\n\n"
    "def run(x):\n    return x * 2\n\n"
    "def generate_inputs(axes, device):\n    return {'x': torch.randn(axes['n'], 64, device=device)}\n"
)


@pytest.mark.parametrize("custom", [False, True])
def test_the_trusted_worker_lets_the_loop_go_before_remaking_custom_inputs(tmp_path, custom):
    """Inputs a custom generator makes are made again from each checked call's own seed, so the
    outside clock's loop (its input sets, output buffers and mirror) is let go before the
    references run, not held beside them (the trusted worker's peak on KernelBench ReLU, 54.6
    to 36.6 GiB on the H200); inputs the guard draws itself are replayed from that loop."""
    from guard.problems.schema import Definition
    from guard.runner import trusted_role as tr

    raw = {**DEF, "op_type": "elementwise", "reference": CUSTOM_REFERENCE if custom else DEF["reference"]}
    if custom:
        raw["custom_inputs_entrypoint"] = "generate_inputs"
    d = Definition.model_validate(raw)
    workload = {"uuid": "w", "axes": {"n": 4}, "inputs": {"x": {"type": "custom" if custom else "random"}}}
    role = tr.TrustedRole("cpu", tmp_path)
    key = d.content_hash()
    assert role.handle({"op": "problem", "key": key, "definition": d.to_json(), "blob_root": None})["ok"]
    common = {"key": key, "workload": workload, "axes": {"n": 4}, "sets": [1, 2]}
    assert role.handle(m.Overhead(**common, seed=3, iters=4).model_dump())["ok"]
    assert role._loop is not None
    reply = role.handle(
        m.VerifyReplays(
            **common,
            run_seed=3,
            regime="stream",
            iterations=[1],
            digests=[[[0.0] * m.DIGEST_WIDTH]],
            tolerances=[m.Tolerance(atol=1e-3, rtol=1e-3)],
            names=["y"],
        ).model_dump()
    )
    assert reply["ok"] and reply["passed"] is False  # a digest of zeros is no answer
    assert (role._loop is None) == custom


def test_a_cpu_check_draws_only_the_calls_it_checks(monkeypatch):
    """A CPU's loop draws nothing in its windows, so each call's inputs come from their own
    seed: the check of call 5 gets the inputs the window's staging drew for call 5, and draws
    no call before it (a stream of draws would have drawn all six)."""
    staged = {
        it: [a.clone() for a in args] for it, args in _loop(None, _sets(), own=False).inputs_at(9, list(range(6)))
    }
    checker = _loop(None, _sets(), own=False)
    drawn = []
    real = checker.refiller.__call__
    monkeypatch.setattr(checker, "refiller", lambda live, seed: (drawn.append(seed), real(live, seed)))
    got = {it: [a.clone() for a in args] for it, args in checker.inputs_at(9, [5, 2])}
    assert sorted(got) == [2, 5] and len(drawn) == 2
    for it in (2, 5):
        assert all(torch.equal(a, b) for a, b in zip(got[it], staged[it]))
    assert not torch.equal(staged[2][0], staged[5][0])  # and every call's are new


def test_a_prepared_trusted_loop_is_the_one_its_first_window_runs(tmp_path):
    """On a GPU the guard has the trusted worker build the outside clock's loop while the
    candidate's worker reads its timed loop's figures (``m.PrepareLoop``, session 47): the
    first ``Overhead`` then finds it built and its set-up is a sync. Shown here on the CPU, whose
    guard does not ask for it (its windows are drawn and staged otherwise)."""
    from guard.problems.schema import Definition
    from guard.runner import trusted_role as tr

    d = Definition.model_validate({**DEF, "op_type": "elementwise"})
    workload = {"uuid": "w", "axes": {"n": 4}, "inputs": {"x": {"type": "random"}}}
    role = tr.TrustedRole("cpu", tmp_path)
    key = d.content_hash()
    assert role.handle({"op": "problem", "key": key, "definition": d.to_json(), "blob_root": None})["ok"]
    common = {"key": key, "workload": workload, "axes": {"n": 4}, "sets": [1, 2]}
    assert role.handle(m.PrepareLoop(**common, iters=4, projection_seed=9).model_dump())["ok"]
    prepared = role._loop
    assert prepared is not None
    reply = m.OverheadReply.model_validate(
        role.handle(m.Overhead(**common, seed=3, iters=4, projection_seed=9).model_dump())
    )
    assert reply.ok and role._loop is prepared
    # a window of another projection, or more calls than the loop holds, builds its own
    role.handle(m.Overhead(**common, seed=3, iters=4, projection_seed=10).model_dump())
    assert role._loop is not prepared


def test_a_loop_names_memory_a_later_call_returned_again():
    """``held_outputs.returned_again``: a loop holds every call's outputs, so two calls whose
    outputs lie in the same bytes mean a kernel that reused a buffer it returned before."""
    expected = [([4, 8], "float32"), ([4], "float32")]
    dense = ([8, 1], [1])

    def call(a: int, b: int) -> list[tuple[int, list[int]]]:
        return [(a, dense[0]), (b, dense[1])]

    apart = [(i, call(0x10000 + i * 0x1000, 0x90000 + i * 0x100)) for i in range(4)]
    assert held_outputs.returned_again(apart, expected) is None
    # call 3's first output in call 1's bytes (two buffers in turn: 0, 1, 0, 1 would be caught at 2)
    again = apart[:3] + [(3, call(0x10000 + 1 * 0x1000 + 64, 0x90000 + 3 * 0x100))]
    assert held_outputs.returned_again(again, expected) == (1, 3, 0)
    # one call's two outputs in the same bytes is not a reuse across calls; an empty output
    # (address 0) and one described past any memory are not looked at
    same_call = [(0, call(0x10000, 0x10000)), (1, [(0, dense[0]), (m.MEMORY_LIMIT, dense[1])])]
    assert held_outputs.returned_again(same_call, expected) is None
    # two column slices of one arena buffer interleave without sharing an element: honest
    arena = [(0, [(0x20000, [64, 1]), (0x90000, [1])]), (1, [(0x20000 + 8 * 4, [64, 1]), (0x90100, [1])])]
    assert held_outputs.returned_again(arena, expected) is None
    # a dense output inside an earlier call's dense one is caught, whatever its offset
    shifted = [(0, call(0x30000, 0x90000)), (1, call(0x30000 + 4 * 12, 0x90100))]
    assert held_outputs.returned_again(shifted, expected) == (0, 1, 0)
    # the output named is the later call's, wherever it lies: call 1's first output ends in
    # call 0's second (which lies further up than call 0's first)
    below = [(0, call(0x40000, 0x50000)), (1, call(0x50000 - 4 * 16, 0x60000))]
    assert held_outputs.returned_again(below, expected) == (0, 1, 0)


def test_a_loop_names_a_strided_output_returned_again():
    """Strided outputs are compared by their elements too (only dense ones were until red team
    49 found a kept strided buffer REWARD_HACK in the windows): a column block of one wide
    buffer described again, or one moved onto columns an earlier call was given, is named; the
    next block of the buffer is not."""
    expected = [([4, 8], "float32")]
    block = [32, 1]  # a quarter of the columns of a [4, 32] float32 buffer at 0x20000

    def at(column: int) -> list[tuple[int, list[int]]]:
        return [(0x20000 + 4 * column, block)]

    assert held_outputs.returned_again([(0, at(0)), (1, at(8)), (2, at(16))], expected) is None
    assert held_outputs.returned_again([(0, at(0)), (1, at(8)), (2, at(0))], expected) == (0, 2, 0)
    assert held_outputs.returned_again([(0, at(0)), (1, at(12))], expected) is None
    assert held_outputs.returned_again([(0, at(8)), (1, at(4))], expected) == (0, 1, 0)
