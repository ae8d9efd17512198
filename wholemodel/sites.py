"""Sites: the places in a model where a kernel of one op family can be plugged in.

A site knows which modules it applies to, which method of theirs it replaces, the problem
axes of one call (so profiling can write problems with the model's real shapes), and how
to compute that call with a kernel's ``run`` (so verification can plug kernels in). The
seed problem of the same family serves as the template of the problems it writes.

Sites, by module:
  rmsnorm     a module named like RMSNorm with ``weight`` and ``eps``: forward(x)
  layernorm   torch.nn.LayerNorm with weight and bias: forward(x)
  matmul      torch.nn.Linear: forward(x) (a bias is added after the kernel)
  swiglu_mlp  a module with Linear ``gate_proj``, ``up_proj``, ``down_proj`` (no bias):
              forward(x) = down_proj(silu(gate_proj(x)) * up_proj(x)); the kernel does
              the gate and up projections and the activation, down_proj stays a Linear
  attention   a module with a method ``attend(q, k, v)``: causal attention with q of shape
              [batch, heads, seq, dim] and k, v of [batch, kv_heads, seq, dim]
  rope        a module named like RotaryEmbedding: forward(x, cos, sin) with x of shape
              [tokens, heads, head_dim], cos and sin [tokens, head_dim / 2] (rotate-half)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn


class Site:
    family: str = ""
    template: str = ""  # the seed problem used as template
    method: str = "forward"
    absorbs: tuple[str, ...] = ()  # children whose time belongs to this site
    summary: str = ""  # what the kernel computes, formatted with ``dtype`` and the constants
    template_constants: dict[str, float] = {}  # the template problem's constants

    def matches(self, module: nn.Module) -> bool:
        raise NotImplementedError

    def axes(self, module: nn.Module, args: tuple) -> dict[str, int] | None:
        """The problem axes of one call; None where the site cannot serve it."""
        raise NotImplementedError

    def constants(self, module: nn.Module) -> dict[str, float]:
        """Values baked into the problem's reference (a kernel serves only modules with these)."""
        return {}

    def scalars(self, module: nn.Module) -> dict[str, float]:
        """Scalar inputs of the problem's workloads (eps, ...)."""
        return {}

    def call(self, module: nn.Module, run: Callable, args: tuple):
        """The call's result, computed by a kernel's ``run``."""
        raise NotImplementedError


def _tokens(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


class RMSNormSite(Site):
    family, template = "rmsnorm", "rmsnorm_llama3_8b"
    summary = "RMSNorm over the last dimension (eps {eps:g}), float32 arithmetic, {dtype} in and out."
    template_constants = {"eps": 1e-5}

    def matches(self, module):
        return "rmsnorm" in type(module).__name__.lower() and isinstance(getattr(module, "weight", None), torch.Tensor)

    def axes(self, module, args):
        x = args[0]
        if module.weight.dim() != 1 or x.shape[-1] != module.weight.shape[0]:
            return None
        return {"num_tokens": _tokens(x), "hidden_size": x.shape[-1]}

    def constants(self, module):
        return {"eps": self.eps(module)}

    def eps(self, module) -> float:
        for attr in ("eps", "variance_epsilon"):  # ours and torch.nn.RMSNorm; Hugging Face's
            if getattr(module, attr, None) is not None:
                return float(getattr(module, attr))
        return float(torch.finfo(module.weight.dtype).eps)  # torch.nn.RMSNorm with eps=None

    def call(self, module, run, args):
        x = args[0]
        return run(x.reshape(-1, x.shape[-1]), module.weight).reshape(x.shape)


class LayerNormSite(Site):
    family, template = "layernorm", "layernorm_gpt2_bf16"
    summary = (
        "LayerNorm over the last dimension with weight and bias (eps is an input), float32 arithmetic, "
        "{dtype} in and out."
    )

    def matches(self, module):
        return (
            isinstance(module, nn.LayerNorm)
            and len(module.normalized_shape) == 1
            and module.weight is not None
            and module.bias is not None
        )

    def axes(self, module, args):
        x = args[0]
        return {"num_tokens": _tokens(x), "hidden_size": x.shape[-1]}

    def scalars(self, module):
        return {"eps": float(module.eps)}

    def call(self, module, run, args):
        x = args[0]
        return run(x.reshape(-1, x.shape[-1]), module.weight, module.bias, module.eps).reshape(x.shape)


class LinearSite(Site):
    family, template = "matmul", "matmul_bf16_llm_projections"
    summary = (
        "y = x @ weight.T, a linear layer's product (its bias, if any, is added outside the kernel), "
        "{dtype} in and out."
    )

    def matches(self, module):
        return isinstance(module, nn.Linear)

    def axes(self, module, args):
        x = args[0]
        return {"M": _tokens(x), "N": module.out_features, "K": module.in_features}

    def call(self, module, run, args):
        x = args[0]
        y = run(x.reshape(-1, x.shape[-1]), module.weight).reshape(*x.shape[:-1], module.out_features)
        return y if module.bias is None else y + module.bias


class SwiGLUSite(Site):
    family, template = "swiglu_mlp", "swiglu_mlp_gate_up_bf16"
    absorbs = ("gate_proj", "up_proj")
    summary = (
        "silu(x @ gate_proj.T) * (x @ up_proj.T): a SwiGLU MLP's gate and up projections with the "
        "activation, {dtype} in and out."
    )

    def matches(self, module):
        parts = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(isinstance(p, nn.Linear) and p.bias is None for p in parts):
            return False
        act = getattr(module, "act_fn", None)  # Hugging Face's LlamaMLP names its activation
        return act is None or isinstance(act, nn.SiLU) or type(act).__name__.lower().startswith("silu")

    def axes(self, module, args):
        x = args[0]
        return {
            "num_tokens": _tokens(x),
            "hidden_size": x.shape[-1],
            "intermediate_size": module.gate_proj.out_features,
        }

    def call(self, module, run, args):
        x = args[0]
        h = run(x.reshape(-1, x.shape[-1]), module.gate_proj.weight, module.up_proj.weight)
        return module.down_proj(h.reshape(*x.shape[:-1], h.shape[-1]))


class AttentionSite(Site):
    family, template = "attention", "attention_prefill_causal_gqa_bf16"
    method = "attend"
    summary = "Causal grouped-query attention softmax(q k^T / sqrt(d)) v over prefill sequences, {dtype} in and out."

    def matches(self, module):
        return callable(getattr(module, "attend", None))

    def axes(self, module, args):
        q, k, v = args[:3]
        if q.dim() != 4 or k.shape != v.shape or q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
            return None  # only the prefill shape the template covers
        return {
            "batch_size": q.shape[0],
            "seq_len": q.shape[2],
            "num_kv_heads": k.shape[1],
            "gqa_group": q.shape[1] // k.shape[1],
            "head_dim": q.shape[3],
        }

    def call(self, module, run, args):
        return run(*(t.contiguous() for t in args[:3]))


class RopeSite(Site):
    family, template = "rope", "rope_llama_bf16"
    summary = "Rotary position embedding in the rotate-half convention, float32 arithmetic, {dtype} in and out."

    def matches(self, module):
        return "rotary" in type(module).__name__.lower()

    def axes(self, module, args):
        if len(args) < 3:
            return None
        x, cos, sin = args[:3]
        if x.dim() != 3 or cos.shape != (x.shape[0], x.shape[2] // 2) or sin.shape != cos.shape:
            return None
        return {"num_tokens": x.shape[0], "num_heads": x.shape[1], "head_dim": x.shape[2]}

    def call(self, module, run, args):
        return run(*(t.contiguous() for t in args[:3]))


# Order matters: the first site that matches a module owns it.
SITES: tuple[Site, ...] = (RMSNormSite(), LayerNormSite(), SwiGLUSite(), AttentionSite(), RopeSite(), LinearSite())
BY_FAMILY: dict[str, Site] = {s.family: s for s in SITES}


@dataclass
class Placement:
    qual: str  # the module's qualified name in the model
    module: nn.Module
    site: Site


def placements(model: nn.Module) -> Iterator[Placement]:
    for qual, module in model.named_modules():
        for site in SITES:
            if site.matches(module):
                yield Placement(qual, module, site)
                break


def wrap_method(module: nn.Module, name: str, wrapper: Callable[[Callable, tuple, dict], object]) -> Callable[[], None]:
    """Replace ``module.<name>`` on this instance by ``wrapper(original, args, kwargs)``; returns the undo."""
    original = getattr(module, name)
    had_own = name in module.__dict__

    def patched(*args, **kwargs):
        return wrapper(original, args, kwargs)

    setattr(module, name, patched)

    def undo() -> None:
        if had_own:
            setattr(module, name, original)
        else:
            delattr(module, name)

    return undo
