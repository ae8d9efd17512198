"""Outputs as raw files between the workers (guard/runner/tensorio.py): every dtype's bytes
come back exactly, the chunked path used for device tensors crosses its chunk boundaries, and
a file that is not what its description says is refused before anything is read."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from guard.runner import tensorio  # noqa: E402
from guard.runner.common import as_bytes, flat  # noqa: E402
from guard.runner.tensorio import read_tensor, write_tensor  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int8, torch.bool]


def _sample(dtype: torch.dtype, shape=(7, 13)) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g).to(dtype)
        t.view(-1)[0] = float("nan")
        t.view(-1)[1] = -0.0
        return t
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    def raw(t: torch.Tensor) -> bytes:
        return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()

    return a.shape == b.shape and a.dtype == b.dtype and raw(a) == raw(b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_tensor_comes_back_byte_for_byte(tmp_path, dtype):
    t = _sample(dtype)
    meta = write_tensor(t, tmp_path / "o.bin")
    assert meta["shape"] == [7, 13]
    assert _same_bytes(read_tensor(meta, "cpu"), t)


def test_a_strided_and_an_empty_tensor(tmp_path):
    t = torch.arange(60, dtype=torch.float32).reshape(6, 10).t()  # not contiguous
    assert torch.equal(read_tensor(write_tensor(t, tmp_path / "s.bin"), "cpu"), t)
    e = torch.empty(0, 5)
    back = read_tensor(write_tensor(e, tmp_path / "e.bin"), "cpu")
    assert back.shape == (0, 5)


@pytest.mark.parametrize("stage", [1, 5, 64, 91, 1 << 20])
def test_the_chunked_path_crosses_every_boundary(tmp_path, stage):
    """The path a device tensor takes (written and read through a bounded host buffer), run
    here on host tensors with buffers smaller than, equal to and larger than the data."""
    t = _sample(torch.float32)  # 364 bytes
    path = tmp_path / "c.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        tensorio._write_staged(fd, as_bytes(flat(t)), stage)
    finally:
        os.close(fd)
    assert path.read_bytes() == t.numpy().tobytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        raw = tensorio._read_staged(fd, path, path.stat().st_size, "cpu", stage)
    finally:
        os.close(fd)
    assert _same_bytes(raw.view(torch.float32).reshape(7, 13), t)


def test_a_file_of_another_size_or_kind_is_refused(tmp_path):
    meta = write_tensor(torch.ones(4, 4), tmp_path / "o.bin")
    with pytest.raises(ValueError, match="64 bytes, expected 128"):
        read_tensor({**meta, "shape": [4, 4, 2]}, "cpu")
    link = tmp_path / "link.bin"
    link.symlink_to(tmp_path / "o.bin")
    with pytest.raises(ValueError, match="plain file"):
        read_tensor({**meta, "file": str(link)}, "cpu")
    # nor a folder replaced by a link to another that holds a file of that name and size
    (tmp_path / "elsewhere").mkdir()
    write_tensor(torch.ones(4, 4), tmp_path / "elsewhere" / "o.bin")
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="plain file"):
        read_tensor({**meta, "file": str(tmp_path / "out" / "o.bin")}, "cpu")
    fifo = tmp_path / "fifo.bin"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a plain file"):
        read_tensor({**meta, "file": str(fifo)}, "cpu")
    with pytest.raises(ValueError, match="bad tensor description"):
        read_tensor({**meta, "dtype": "complex32"}, "cpu")
