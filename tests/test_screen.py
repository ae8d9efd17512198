"""The static screen, rule by rule: each finding names the construct and its line."""

from __future__ import annotations

import pytest

from guard.candidates.load import from_source
from guard.screen import screen_solution
from guard.screen.cpp_rules import check as cpp_check
from guard.screen.python_rules import check as py_check

BANNED = {
    "import threading": "import",
    "from concurrent.futures import ThreadPoolExecutor": "import",
    "import os": "import",
    "import sys": "import",
    "import gc": "import",
    "import ctypes": "import",
    "x = open('f')": "call",
    "eval('1')": "call",
    "__import__('os')": "call",
    "getattr(torch, name)": "call",
    "getattr(torch, '__dict__')": "attribute",
    "setattr(torch, 'equal', None)": "call",
    "torch.equal = None": "monkey-patch",
    "torch.Tensor.add = None": "monkey-patch",
    "G = torch.cuda.CUDAGraph; G.replay = None": "monkey-patch",
    "from guard.runner import timing": "import",
    "import kernelarc_mcp": "import",
    "torch.backends.cuda.matmul.allow_tf32 = True": "monkey-patch",
    "s = torch.cuda.Stream()": "attribute",
    "with torch.cuda.stream(s): pass": "attribute",
    "y = x.as_subclass(T)": "attribute",
    "class T(torch.Tensor): pass": "subclass",
    "f = (lambda: 0).__globals__": "attribute",
    "torch.load('w.pt')": "call",
    "p = '.kernelarc/secret.key'": "workspace",
    "try:\n    pass\nexcept Exception:\n    pass": "try",
}


@pytest.mark.parametrize("line,rule", BANNED.items(), ids=list(BANNED))
def test_python_rule(line, rule):
    src = "import torch\nname = 'x'\n" + line + "\n"
    findings = py_check("k.py", src)
    assert any(f.rule == rule and f.line == 3 for f in findings), findings


ALLOWED = [
    "y = torch.stack([x, x])",
    "m = torch.nn.Linear(2, 2)\nfor sub in m.modules(): pass",
    "import triton\nimport triton.language as tl",
    "from torch.utils.cpp_extension import load_inline",
    "import math\nv = math.sqrt(2.0)",
    "out = torch.empty(3)\nout.data_ptr()",
    "cfg = {}\ncfg['a'] = 1",
    "z = getattr(torch, 'float32')",
    "s = torch.cuda.current_stream()",
]


@pytest.mark.parametrize("src", ALLOWED)
def test_honest_code_passes(src):
    assert py_check("k.py", "import torch\n" + src + "\n") == []


def test_syntax_error_is_a_compile_error_with_its_line():
    res = screen_solution(from_source("def run(x)\n  return x\n", "pytorch"), 100_000, 4)
    assert res.status == "COMPILE_ERROR" and res.findings[0].line == 1


def test_size_limits():
    res = screen_solution(from_source("x = 1\n" * 1000, "pytorch"), 1000, 4)
    assert res.status == "COMPILE_ERROR" and "bytes" in res.message()


CPP_BANNED = {
    "cudaStream_t s; cudaStreamCreate(&s);": "stream",
    "auto st = at::cuda::getStreamFromPool();": "stream",
    "std::thread t(f);": "thread",
    'system("ls");': "process",
    'FILE* f = fopen("x", "r");': "file",
    'const char* e = getenv("HOME");': "environment",
    "#include <fstream>": "include",
    "cudaLaunchHostFunc(stream, wait_cb, nullptr);": "host-callback",
    "cudaGraphAddHostNode(&node, graph, nullptr, 0, &params);": "host-callback",
}


@pytest.mark.parametrize("line,rule", CPP_BANNED.items(), ids=list(CPP_BANNED))
def test_cpp_rule(line, rule):
    src = "#include <torch/extension.h>\n\n" + line + "\n"
    assert any(f.rule == rule and f.line == 3 for f in cpp_check("k.cu", src))


def test_cpp_comments_and_strings_are_ignored():
    src = '// cudaStreamCreate(&s) is banned\n/* std::thread */\nconst char* m = "fopen(";\n'
    assert cpp_check("k.cu", src) == []
