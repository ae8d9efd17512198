"""Op families from names: shared by problem import and the profiler's kernel classifier."""

from __future__ import annotations

import re

# Ordered: the first rule whose pattern matches wins ("attention_output_projection" is a
# projection, so the matmul rule comes before the attention rule).
FAMILY_RULES: list[tuple[str, str]] = [
    ("rmsnorm", r"rms_?norm"),
    ("layernorm", r"layer_?norm|\bln\b"),
    ("softmax", r"softmax"),
    ("cross_entropy", r"cross_?entropy|nll_?loss|log_?softmax"),
    ("rope", r"rope|rotary"),
    ("decoder_block", r"decoder_?(block|layer)|transformer_?(block|layer)"),
    ("attn_out_proj_residual", r"(o_?proj|out(put)?_?proj(ection)?).*residual"),
    ("swiglu_mlp", r"swiglu|geglu|gate_?up|\bmlp\b|silu_?and_?mul|moe|expert"),
    ("matmul", r"gemm|matmul|\bmm\b|bmm|linear|proj(ection)?|addmm|cublas|cutlass"),
    ("attention", r"attention|attn|sdpa|gqa|mha|mqa|flash|decode|prefill"),
    ("reduce", r"reduc|\bsum\b|vectorsum|\bmean\b|argmax"),
    ("elementwise", r"vecadd|add|mul|relu|gelu|silu|elementwise|copy|cast"),
]


def classify(*names: str | None) -> str:
    """The op family of the first name that matches a rule, else ``"other"``."""
    for name in names:
        if not name:
            continue
        text = name.lower().replace("-", "_").replace(".", "_")
        # word boundaries treat '_' as a word character; split it for the \b rules
        spaced = text.replace("_", " ")
        for family, pattern in FAMILY_RULES:
            if re.search(pattern, text) or re.search(pattern, spaced):
                return family
    return "other"
