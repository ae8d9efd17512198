"""Safe arithmetic over axis values: axis expressions, FLOP/byte formulas, constraints.

Only numbers, axis names, arithmetic, comparisons and a few functions are allowed, so a
formula in a problem file can never run code.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping

from ..pyparse import parse

BINARY_OPS: dict[
    type[ast.operator], Callable[[float, float], float]
] = {  # the arithmetic a formula or a size constant may use
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type[ast.cmpop], Callable[[float, float], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCS: dict[str, Callable[..., float]] = {
    "min": min,
    "max": max,
    "ceil": math.ceil,
    "floor": math.floor,
    "log2": math.log2,
    "sqrt": math.sqrt,
    "abs": abs,
}


class FormulaError(ValueError):
    pass


def names_in(expression: str) -> set[str]:
    """Axis names an expression refers to."""
    tree = _parse(expression)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _FUNCS}


def evaluate(expression: str, values: Mapping[str, float]) -> float:
    """Evaluate ``expression`` with ``values`` bound to axis names."""
    return _eval(_parse(expression).body, values, expression)


def _parse(expression: str) -> ast.Expression:
    if len(expression) > 2000:
        raise FormulaError("formula longer than 2000 characters")
    try:
        return parse(expression, mode="eval")
    except SyntaxError as exc:
        raise FormulaError(f"cannot parse formula {expression!r}: {exc.msg}") from None


def _eval(node: ast.AST, values: Mapping[str, float], src: str) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise FormulaError(f"formula {src!r} uses unknown axis {node.id!r}")
        return values[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY_OPS:
        left, right = _eval(node.left, values, src), _eval(node.right, values, src)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise FormulaError(f"exponent too large in {src!r}")
        try:
            return BINARY_OPS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise FormulaError(f"division by zero in {src!r}") from None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, values, src)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
        left = _eval(node.left, values, src)
        right = _eval(node.comparators[0], values, src)
        return float(_CMPOPS[type(node.ops[0])](left, right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
        return _FUNCS[node.func.id](*(_eval(a, values, src) for a in node.args))
    raise FormulaError(f"formula {src!r} contains an unsupported construct: {ast.dump(node)[:80]}")
