"""Stored inputs written byte for byte (``guard/problems/blobs.py``): the copy of a
safetensors file that candidates may read holds only the tensors visible workloads name."""

from __future__ import annotations

import struct

import pytest
import torch

from guard.problems import blobs
from guard.runner.inputs import read_safetensors

from helpers import write_safetensors


def test_a_subset_keeps_the_named_tensors_bit_for_bit_and_nothing_else(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "vis": torch.randn(3, 5, generator=gen),
        "ho": torch.randn(777, 8, generator=gen),
        "idx": torch.arange(7, dtype=torch.int64),
        "half": torch.randn(4, generator=gen).to(torch.bfloat16),
    }
    src = tmp_path / "all.safetensors"
    write_safetensors(src, tensors, {"workload": "held-out-secret"})
    assert blobs.tensor_keys(src) == set(tensors)
    dest = tmp_path / "out" / "vis.safetensors"
    assert blobs.write_subset(src, dest, {"vis", "idx", "half", "absent"}) == ["absent"]
    assert blobs.tensor_keys(dest) == {"vis", "idx", "half"}
    got = read_safetensors(dest)
    for key in ("vis", "idx", "half"):
        assert torch.equal(got[key], tensors[key])
    raw = dest.read_bytes()
    assert b"held-out-secret" not in raw and b"777" not in raw  # neither its metadata nor its shape
    (size,) = struct.unpack("<Q", raw[:8])
    assert (8 + size) % 8 == 0  # the data stays aligned


def test_what_is_not_a_safetensors_file_is_said(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"abc")
    with pytest.raises(blobs.BlobError, match="too short"):
        blobs.tensor_keys(bad)
    bad.write_bytes(struct.pack("<Q", 4) + b"[1] ")
    with pytest.raises(blobs.BlobError, match="no mapping"):
        blobs.header(bad)


def test_a_files_tensor_names_are_read_once_per_version(tmp_path, monkeypatch):
    """Every evaluation asks which tensors each stored input's file holds: the header is read
    once per version of the file, and again once the file changes."""
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"a": (2, 3)})
    reads = []
    real = blobs.header
    monkeypatch.setattr(blobs, "header", lambda p: reads.append(p) or real(p))
    assert blobs.tensor_keys(path) == {"a"} and blobs.tensor_keys(path) == {"a"}
    assert len(reads) == 1
    write_safetensors(path, {"a": (2, 3), "b": (4,)})
    assert blobs.tensor_keys(path) == {"a", "b"} and len(reads) == 2
