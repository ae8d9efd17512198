"""The copies a candidate worker compares against (guard/runner/snapshots.py), in chunks
smaller than the tensors so that every boundary is crossed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from guard.runner.snapshots import close, same_bytes, snapshots  # noqa: E402

CHUNK = 64  # bytes: 16 float32 elements per chunk


def snapshot(t):
    return snapshots([t], call_bytes=0)[0]


def test_a_snapshot_is_not_reached_by_later_writes():
    t = torch.arange(100, dtype=torch.float32)
    copy = snapshot(t)
    t[57] = -1
    assert copy[57] == 57 and not same_bytes(t, copy, CHUNK)


@pytest.mark.parametrize("where", [0, 15, 16, 63, 99])
def test_one_changed_element_is_found_in_any_chunk(where):
    t = torch.randn(100)
    copy = snapshot(t)
    assert same_bytes(t, copy, CHUNK)
    t[where] += 1e-3
    assert not same_bytes(t, copy, CHUNK)
    assert not close(t, copy, atol=1e-6, rtol=0.0, chunk_bytes=CHUNK)
    assert close(t, copy, atol=1e-2, rtol=0.0, chunk_bytes=CHUNK)


def test_bytes_compare_nans_equal_and_signed_zeros_apart():
    t = torch.tensor([float("nan"), 0.0, 1.0] * 10)
    assert same_bytes(t, t.clone(), CHUNK)  # torch.equal calls NaN unequal to itself
    flipped = t.clone()
    flipped[4] = -0.0
    assert not same_bytes(t, flipped, CHUNK)  # torch.equal calls them equal
    assert close(t, flipped, atol=0.0, rtol=0.0, chunk_bytes=CHUNK)


def test_shapes_dtypes_and_exact_kinds():
    t = torch.arange(40, dtype=torch.int64)
    assert not same_bytes(t, t.reshape(4, 10).clone())
    assert not same_bytes(t, t.to(torch.int32))
    assert not close(t, t.to(torch.float64), 1.0, 1.0)
    off = t.clone()
    off[33] += 1
    assert not close(t, off, atol=10.0, rtol=10.0, chunk_bytes=CHUNK)  # integers compare exactly
    b = torch.rand(50) > 0.5
    assert same_bytes(b, b.clone(), 8) and close(b, b.clone(), 0.0, 0.0, 8)


def test_half_precision_and_strided_tensors():
    t = torch.randn(30, 20).to(torch.bfloat16)
    copy = snapshot(t)
    assert close(t, copy, 0.0, 0.0, CHUNK)
    strided = t.t()  # not contiguous: compared in its logical order
    assert same_bytes(strided, snapshot(strided), CHUNK)
    t[29, 19] = 100
    assert not close(t, copy, atol=1.0, rtol=0.0, chunk_bytes=CHUNK)


def test_large_device_copies_stay_on_the_device_only_with_room_for_all_of_them():
    """A copy through pageable host memory cost about 2.4 s per 7 GiB on the H200: the large
    copies of one step stay on the device when it has room for all of them, for twice the
    call's own data (its outputs and temporaries, the other worker's reference beside it) and
    the reserve; else they all go to the host (a red team showed copies decided one at a time
    could leave an honest call too little memory)."""
    from guard.runner.snapshots import DEVICE_RESERVE_BYTES, on_host

    copies, call = 12 << 30, 18 << 30
    assert on_host(copies, call, room=copies + 2 * call + DEVICE_RESERVE_BYTES - 1)
    assert not on_host(copies, call, room=copies + 2 * call + DEVICE_RESERVE_BYTES)


def test_where_the_free_memory_cannot_be_read_copies_go_to_the_host(monkeypatch):
    from guard.runner import snapshots as s

    monkeypatch.setattr(s.T, "cuda_mem_get_info", None)
    assert s.device_room(torch.device("cuda", 0)) == 0

    def broken(index):
        raise RuntimeError("no device")

    monkeypatch.setattr(s.T, "cuda_mem_get_info", broken)
    assert s.device_room(torch.device("cuda", 0)) == 0
    monkeypatch.setattr(s.T, "cuda_mem_get_info", lambda index: (64 << 30, 80 << 30))
    assert s.device_room(torch.device("cuda", 0)) == 64 << 30


def test_copies_of_a_step_pass_other_arguments_through():
    from guard.runner.snapshots import snapshots

    t = torch.arange(5.0)
    got = snapshots([t, 3, None], call_bytes=0)
    assert got[1:] == [3, None] and torch.equal(got[0], t) and got[0].data_ptr() != t.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_close_step_keeps_its_temporaries_within_the_chunk(monkeypatch, dtype):
    """allclose makes several float32 temporaries of its operands' size: a step's operands are
    sized so that all of them fit in ``chunk_bytes`` (a full-size step held 4x its chunk)."""
    from guard.runner import snapshots as snap

    seen = []
    real = torch.allclose

    def counting(a, b, **kw):
        seen.append(a.numel())
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "allclose", counting)
    chunk = 4096
    t = torch.randn(10_000).to(dtype)
    assert close(t, t.clone(), atol=0.0, rtol=0.0, chunk_bytes=chunk)
    assert sum(seen) == t.numel() and len(seen) > 1
    assert max(seen) * 4 * snap.CLOSE_TEMPORARIES <= chunk
