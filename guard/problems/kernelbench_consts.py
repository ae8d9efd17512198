"""Module-level constants of a KernelBench file, read from its syntax tree (no code runs).

KernelBench sizes live in module constants (``batch_size = 16``, ``height = width = 256``,
``depth, height, width = (16, 32, 32)``, ``input_shape = (32768,)``) that ``get_inputs``,
``get_init_inputs`` and ``Model`` read as globals. Each positive integer constant given
literally, and each integer element of a literal tuple or list, becomes an axis; constants
computed from others (``groups = in_channels``, ``bias_shape = (out_channels, 1, 1)``) are
not axes but follow them.

``assignments`` are the module's side-effect-free top-level assignments in source order.
The generated adapter (and the importer's probe) re-executes them with the axes applied after
each binding, so derived constants are recomputed and every function sees the new sizes.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ..pyparse import parse
from .formulas import BINARY_OPS

# a formula's arithmetic, and the shifts KernelBench sizes are sometimes written with (1 << 14)
_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    **BINARY_OPS,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
MAX_SEQUENCE_AXES = 8  # a literal tuple/list longer than this gives no axes


class _NotPure(Exception):
    pass


@dataclass(frozen=True)
class Constant:
    axis: str  # the axis name
    name: str  # the module global
    index: int | None  # element of a tuple/list global, or None
    value: int


@dataclass
class ModuleConstants:
    constants: list[Constant] = field(default_factory=list)
    # (statement source, [(axis, global, index)]) in source order
    assignments: list[tuple[str, list[tuple[str, str, int | None]]]] = field(default_factory=list)

    @property
    def values(self) -> dict[str, int]:
        return {c.axis: c.value for c in self.constants}


def _pure(node: ast.AST) -> bool:
    """Only literals, names, arithmetic, tuples/lists and constant subscripts: no calls."""
    allowed = (
        ast.Constant,
        ast.Name,
        ast.Load,
        ast.Tuple,
        ast.List,
        ast.BinOp,
        ast.UnaryOp,
        ast.USub,
        ast.UAdd,
        ast.Subscript,
        ast.Slice,
        *_BINOPS,
    )
    return all(isinstance(n, allowed) for n in ast.walk(node))


def _eval(node: ast.AST, env: dict[str, object]) -> object:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float, bool, str)) or node.value is None:
            return node.value
        raise _NotPure
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise _NotPure
        return env[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_eval(e, env) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, env)
        if not isinstance(v, (int, float)):
            raise _NotPure
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, (ast.Pow, ast.LShift)) and (not isinstance(b, int) or abs(b) > 64):
            raise _NotPure
        if isinstance(node.op, ast.Mult) and not all(isinstance(x, (int, float)) for x in (a, b)):
            raise _NotPure  # no sequence repetition
        try:
            return _BINOPS[type(node.op)](a, b)
        except Exception:
            raise _NotPure from None
    if isinstance(node, ast.Subscript):
        seq, idx = _eval(node.value, env), node.slice
        if isinstance(seq, (tuple, list)) and isinstance(idx, ast.Constant) and isinstance(idx.value, int):
            try:
                return seq[idx.value]
            except IndexError:
                raise _NotPure from None
    raise _NotPure


def _targets(node: ast.AST) -> tuple[list[ast.expr], ast.expr] | None:
    """An assignment's targets and value."""
    if isinstance(node, ast.Assign):
        return list(node.targets), node.value
    if isinstance(node, ast.AnnAssign) and node.value is not None and node.simple:
        return [node.target], node.value
    return None


def _bind(target: ast.AST, value: object, out: list[tuple[str, object]]) -> bool:
    if isinstance(target, ast.Name):
        out.append((target.id, value))
        return True
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)):
        if len(target.elts) != len(value) or any(isinstance(e, ast.Starred) for e in target.elts):
            return False
        return all(_bind(t, v, out) for t, v in zip(target.elts, value))
    return False


def _is_size(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _sizes(v: object) -> list[int] | None:
    """``v`` as a list of sizes, when it is a tuple or list of 1 to MAX_SEQUENCE_AXES sizes."""
    if not isinstance(v, (tuple, list)) or not 0 < len(v) <= MAX_SEQUENCE_AXES:
        return None
    sizes = [x for x in v if _is_size(x)]
    return sizes if len(sizes) == len(v) else None


def module_constants(source: str) -> ModuleConstants:
    """The axes a KernelBench file's module constants give, and how to re-apply them."""
    tree = parse(source)
    env: dict[str, object] = {}
    # per global: its latest binding is a size (int), sizes (list) or something else (None)
    kind: dict[str, int | list[int] | None] = {}
    order: list[str] = []
    statements: list[tuple[str, list[str]]] = []
    for node in tree.body:
        assignment = _targets(node)
        if assignment is None or not _pure(assignment[1]):
            continue
        targets, value_node = assignment
        try:
            value = _eval(value_node, env)
        except _NotPure:
            continue
        bound: list[tuple[str, object]] = []
        if not all(_bind(t, value, bound) for t in targets):
            continue
        literal = not any(isinstance(n, ast.Name) for n in ast.walk(value_node))
        for name, v in bound:
            env[name] = v
            if name not in kind:
                order.append(name)
            sizes = _sizes(v) if literal else None
            if literal and _is_size(v):
                kind[name] = v
            elif sizes is not None:
                kind[name] = sizes
            else:
                kind[name] = None
        statements.append((ast.unparse(node), [n for n, _ in bound]))
    taken = set(env)
    constants: list[Constant] = []
    for name in order:
        k = kind[name]
        if isinstance(k, int):
            constants.append(Constant(name, name, None, k))
        elif k is not None:
            for i, x in enumerate(k):
                axis = f"{name}_{i}"
                while axis in taken:
                    axis += "_"
                taken.add(axis)
                constants.append(Constant(axis, name, i, x))
    by_name: dict[str, list[Constant]] = {}
    for c in constants:
        by_name.setdefault(c.name, []).append(c)
    assignments = [
        (src, [(c.axis, c.name, c.index) for n in names for c in by_name.get(n, [])]) for src, names in statements
    ]
    return ModuleConstants(constants, assignments)


def set_axes_source() -> str:
    """The adapter's ``_ka_set_axes``: re-run the constant assignments, applying the axes."""
    return '''def _ka_set_axes(axes):
    """Module constants at ``axes``: assignments re-run in source order, each axis applied
    right after the statement that binds it, so constants derived from it follow."""
    global _ka_axes_key
    g = globals()
    for stmt, bound in _KA_CONSTANTS:
        exec(stmt, g)
        for axis, name, index in bound:
            if axis not in axes:
                continue
            if index is None:
                g[name] = int(axes[axis])
            else:
                items = list(g[name])
                items[index] = int(axes[axis])
                g[name] = type(g[name])(items)
    _ka_axes_key = tuple(sorted((k, int(v)) for k, v in axes.items() if k in _KA_AXES))
'''
