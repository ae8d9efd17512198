"""Captured references and integrity checks for the worker (imported before any candidate).

Everything the worker does after a candidate has run goes through the references in ``T``,
taken here before candidate code is imported, so a candidate that patches ``torch.equal`` or
``time.perf_counter`` changes nothing the guard relies on; ``violations()`` then reports the
patch itself as a reward hack.
"""

from __future__ import annotations

import builtins
import json
import socket
import statistics
import threading
import time
from types import FunctionType, SimpleNamespace
from typing import Any

import torch
import torch.profiler

if torch.cuda.is_available():
    # The timer's CUPTI sessions import torch._dynamo, which wraps torch.manual_seed on import;
    # import it before the references below are taken, or that wrapping reads as a patch.
    import torch._dynamo  # noqa: F401

try:  # numpy is optional for the harness
    import numpy
except ImportError:  # pragma: no cover
    numpy = None  # type: ignore[assignment]  # the name stays bound either way; nothing here calls it

T = SimpleNamespace(
    perf_counter=time.perf_counter,
    process_time=time.process_time,
    monotonic=time.monotonic,
    equal=torch.equal,
    aminmax=torch.aminmax,
    isfinite=torch.isfinite,
    empty=torch.empty,
    empty_strided=torch.empty_strided,
    zeros=torch.zeros,
    full=torch.full,
    clone=torch.Tensor.clone,
    contiguous=torch.Tensor.contiguous,
    cpu=torch.Tensor.cpu,
    to=torch.Tensor.to,
    view=torch.Tensor.view,
    numpy=torch.Tensor.numpy,
    copy_=torch.Tensor.copy_,
    fill_=torch.Tensor.fill_,
    zero_=torch.Tensor.zero_,
    # the refill of every timed call's inputs (refill.py)
    normal_=torch.Tensor.normal_,
    uniform_=torch.Tensor.uniform_,
    exp2_=torch.Tensor.exp2_,
    random_=torch.Tensor.random_,
    cumsum_=torch.Tensor.cumsum_,
    mul_=torch.Tensor.mul_,
    div_=torch.Tensor.div_,
    as_tensor=torch.as_tensor,
    memory_snapshot=torch.cuda.memory_snapshot,  # the poison's free blocks (poison.py)
    # where the copies of large device tensors fit (snapshots.py): the binding itself, since
    # torch.cuda.mem_get_info looks names up at call time that a candidate could replace
    cuda_mem_get_info=getattr(getattr(torch._C, "_cudart", None), "cudaMemGetInfo", None),
    data_ptr=torch.Tensor.data_ptr,
    untyped_storage=torch.Tensor.untyped_storage,
    # whether a tensor's memory is still referenced once the guard let go of it (repeat_mark.py)
    storage_weak_ref=torch.UntypedStorage._weak_ref,
    storage_expired=torch.UntypedStorage._expired,
    storage_free_weak_ref=torch.UntypedStorage._free_weak_ref,
    active_threads=threading.active_count,
    tensor_type=torch.Tensor,
    bool_dtype=torch.bool,
    uint8_dtype=torch.uint8,
    cuda_sync=torch.cuda.synchronize,
    cuda_event=torch.cuda.Event,
    event_record=torch.cuda.Event.record,
    event_elapsed=torch.cuda.Event.elapsed_time,
    function_mode_depth=getattr(torch._C, "_len_torch_function_stack", None),
    dispatch_mode_depth=getattr(torch._C, "_len_torch_dispatch_stack", None),
    isinstance=builtins.isinstance,
    type=builtins.type,
    len=builtins.len,
    profile=torch.profiler.profile,
    cuda_activity=torch.profiler.ProfilerActivity.CUDA,
    graph_replay=torch.cuda.CUDAGraph.replay,
    marker=getattr(torch.cuda, "_sleep", None),  # a tiny kernel ("spin_kernel") that brackets an eager call
    median=statistics.median,
    # the digest of every timed call (replays.digest)
    reshape=torch.Tensor.reshape,
    numel=torch.Tensor.numel,
    sum=torch.sum,
    dot=torch.dot,
    mv=torch.mv,
    mm=torch.mm,
    stack=torch.stack,
    cat=torch.cat,
    index_select=torch.index_select,
    sqrt=torch.sqrt,
    vector_norm=torch.linalg.vector_norm,
)

# (owner, attribute) pairs whose identity must not change while a candidate is loaded.
_WATCHED: list[tuple[object, str]] = [
    (time, "perf_counter"),
    (time, "perf_counter_ns"),
    (time, "monotonic"),
    (time, "time"),
    (time, "process_time"),
    (torch, "equal"),
    (torch, "allclose"),
    (torch, "isclose"),
    (torch, "isfinite"),
    (torch, "isnan"),
    (torch, "empty"),
    (torch, "empty_like"),
    (torch, "as_tensor"),
    (torch.cuda, "memory_snapshot"),
    (torch._C, "_cuda_memorySnapshot"),
    (torch, "zeros"),
    (torch, "randn"),
    (torch, "manual_seed"),
    (torch, "no_grad"),
    (torch.Tensor, "clone"),
    (torch.Tensor, "cpu"),
    (torch.Tensor, "copy_"),
    (torch.Tensor, "to"),
    (torch.Tensor, "__eq__"),
    (torch.Tensor, "__sub__"),
    (torch.Tensor, "abs"),
    (torch.Tensor, "numpy"),
    (torch.Tensor, "contiguous"),
    (torch.Tensor, "fill_"),
    (torch.Tensor, "normal_"),
    (torch.Tensor, "uniform_"),
    (torch.Tensor, "exp2_"),
    (torch.Tensor, "random_"),
    (torch.Tensor, "cumsum_"),
    (torch.Tensor, "mul_"),
    (torch.Tensor, "div_"),
    (torch.Tensor, "item"),
    (torch.cuda, "synchronize"),
    (torch.cuda, "Event"),
    (torch.cuda.Event, "record"),
    (torch.cuda.Event, "elapsed_time"),
    (torch.cuda.Event, "synchronize"),
    (torch.profiler, "profile"),
    (torch.autograd.profiler, "profile"),
    (torch.cuda.CUDAGraph, "replay"),
    (torch.cuda.CUDAGraph, "capture_begin"),
    (torch.cuda.CUDAGraph, "capture_end"),
    (torch.cuda, "graph"),
    (torch.cuda, "CUDAGraph"),
    (statistics, "median"),
    (torch.Tensor, "reshape"),
    (torch.Tensor, "numel"),
    (torch, "sum"),
    (torch, "dot"),
    (torch, "mv"),
    (torch, "mm"),
    (torch, "stack"),
    (torch, "sqrt"),
    (torch.linalg, "vector_norm"),
    (torch.Tensor, "sum"),
    (torch.testing, "assert_close"),
    (threading, "Thread"),
    (builtins, "isinstance"),
    (builtins, "print"),
    (builtins, "open"),
    (builtins, "__import__"),
    (json, "dumps"),
    (json, "loads"),
    (socket.socket, "sendall"),
    (socket.socket, "recv"),
]
# What the GPU timer reads its figures through (the graph replay, CUPTI's records); private
# classes, so only where this torch has them.
for _owner, _attrs in (
    ("_CUDAGraph", ("replay",)),
    ("_autograd._KinetoEvent", ("duration_ns", "start_ns", "correlation_id", "device_type", "name")),
):
    _obj: Any = torch._C
    for _part in _owner.split("."):
        _obj = getattr(_obj, _part, None)
    if _obj is not None:
        _WATCHED += [(_obj, a) for a in _attrs]

_SNAPSHOT = {(id(o), a): getattr(o, a, None) for o, a in _WATCHED}


def _body(fn: Any) -> tuple[Any, ...]:
    return (fn.__code__, fn.__defaults__, fn.__kwdefaults__)


# A Python function keeps its identity when its body is swapped (``__code__`` set through
# Python's C API from a C++ extension, which the screen does not read as Python): the
# bodies of the captured and watched Python functions are compared too.
_BODIES: dict[int, tuple[FunctionType, tuple[Any, ...]]] = {}


def _take_bodies() -> None:
    _BODIES.clear()
    for fn in [*vars(T).values(), *_SNAPSHOT.values()]:
        if isinstance(fn, FunctionType):
            _BODIES[id(fn)] = (fn, _body(fn))


_take_bodies()


def settle_dynamo() -> None:
    """Import ``torch._dynamo`` and take the torch functions it wraps on import
    (``torch.manual_seed``) as they then are. Only before any candidate code runs: on the
    CPU the worker does this for a candidate whose sources name ``torch.compile``, whose
    first call would otherwise read as a patch (an honest candidate judged REWARD_HACK),
    without every CPU worker paying the import (1.5 s of a core)."""
    import torch._dynamo  # noqa: F401

    for owner, attr in _WATCHED:
        _SNAPSHOT[(id(owner), attr)] = getattr(owner, attr, None)
    _take_bodies()


def violations() -> list[str]:
    """What a candidate changed that it must not have; empty when all is intact."""
    found = []
    for owner, attr in _WATCHED:
        if getattr(owner, attr, None) is not _SNAPSHOT[(id(owner), attr)]:
            name = getattr(owner, "__name__", type(owner).__name__)
            found.append(f"{name}.{attr} was replaced (monkey-patching)")
    for fn, body in _BODIES.values():
        if _body(fn) != body:
            found.append(f"the body of {fn.__module__}.{fn.__qualname__} was replaced")
    if T.function_mode_depth is not None and T.function_mode_depth() != 0:
        found.append("a torch function mode is active (torch calls are being intercepted)")
    if T.dispatch_mode_depth is not None and T.dispatch_mode_depth() != 0:
        found.append("a torch dispatch mode is active (torch ops are being intercepted)")
    return found


def thread_count() -> int:
    n: int = T.active_threads()
    return n
