"""Mutation kinds for bug synthesis, in the manner of SWE-smith's procedural modifiers.

Each kind says where it applies (a node and its place in the parent) and what the node
becomes: a new expression, or a list of statements for statement-level kinds. New nodes
carry no source positions, which is how the splicer tells new text from original text.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Replacement = ast.expr | list[ast.stmt]
NodePath = tuple[tuple[str, int | None], ...]
"""(field, list index or None) steps from a root node down to a node."""

COMPARE_FLIP = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.In: ast.NotIn, ast.NotIn: ast.In,
}
OPERATOR_CHANGE = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
    ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
}
NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
ORDERED_COMPARE = (ast.Lt, ast.Gt, ast.LtE, ast.GtE, ast.In, ast.NotIn)
EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
SKIPPED_FIELDS = {"annotation", "returns", "type_comment"}


@dataclass(frozen=True)
class Mutator:
    """One mutation kind: which nodes it applies to and what it turns them into."""

    kind: str
    applies: Callable[[ast.AST, ast.AST, str], bool]
    """(node, parent, field in parent) -> whether this kind can mutate the node."""
    mutate: Callable[[ast.AST, int], Replacement]
    """(node, salt) -> replacement; the salt is a stable per-site number for +1/-1 choices."""


def walk_body(func: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[tuple[NodePath, ast.AST, ast.AST, str]]:
    """Yield (path, node, parent, field) for every node of a function body, in source order."""
    for i, stmt in enumerate(func.body):
        yield from _walk(stmt, (("body", i),), func, "body")


def _walk(
    node: ast.AST, path: NodePath, parent: ast.AST, field: str
) -> Iterator[tuple[NodePath, ast.AST, ast.AST, str]]:
    yield path, node, parent, field
    for name, value in ast.iter_fields(node):
        if name in SKIPPED_FIELDS:
            continue
        if isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, ast.AST):
                    yield from _walk(item, path + ((name, i),), node, name)
        elif isinstance(value, ast.AST):
            yield from _walk(value, path + ((name, None),), node, name)


def node_at(root: ast.AST, path: NodePath) -> ast.AST:
    """The node reached from root by path."""
    node = root
    for name, index in path:
        value = getattr(node, name)
        node = value if index is None else value[index]
    return node


def replace_at(root: ast.AST, path: NodePath, new: Replacement) -> Replacement:
    """Put new where path points (in place) and return what actually went in."""
    parent = node_at(root, path[:-1])
    name, index = path[-1]
    if index is None:
        setattr(parent, name, new)
        return new
    items = getattr(parent, name)
    spliced = new if isinstance(new, list) else [new]
    if isinstance(new, list) and not new and len(items) == 1:
        spliced = [ast.Pass()]  # a block cannot be empty
    items[index : index + 1] = spliced
    return spliced if isinstance(new, list) else new


def int_node(value: int) -> ast.expr:
    """An integer literal as the parser would build it (negatives are a unary minus)."""
    return ast.Constant(value) if value >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-value))


def literal_int(node: ast.AST) -> int | None:
    """The value of an integer literal like `3` or `-1`, else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = literal_int(node.operand)
        return None if inner is None else -inner
    return None


def shifted(expr: ast.expr, delta: int) -> ast.expr:
    """expr moved by delta: literals and `x + c` adjust c, anything else gets `+ 1`/`- 1`."""
    value = literal_int(expr)
    if value is not None:
        return int_node(value + delta)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
        c = literal_int(expr.right)
        if c is not None:
            c = c + delta if isinstance(expr.op, ast.Add) else c - delta
            return expr.left if c == 0 else ast.BinOp(expr.left, type(expr.op)(), int_node(c))
    return ast.BinOp(expr, ast.Add() if delta > 0 else ast.Sub(), ast.Constant(1))


def _delta(salt: int) -> int:
    return 1 if salt % 2 == 0 else -1


def _is_index(node: ast.AST, parent: ast.AST, field: str) -> bool:
    if isinstance(parent, ast.Subscript) and field == "slice":
        return literal_int(node) is not None or isinstance(node, (ast.Name, ast.BinOp))
    if isinstance(parent, ast.Slice) and field in ("lower", "upper"):
        return True
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "range":
        stop = parent.args[0] if len(parent.args) == 1 else parent.args[1] if len(parent.args) > 1 else None
        return node is stop
    return False


def _differs(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) != ast.dump(b)


def _is_plain_if(node: ast.AST, parent: ast.AST, field: str) -> bool:
    """An `if` that is not an `elif` branch (those share a line with their parent's else)."""
    return isinstance(node, ast.If) and not (isinstance(parent, ast.If) and field == "orelse")


def _remove_condition(node: ast.If, salt: int) -> list[ast.stmt]:
    # A guard that exits is dropped whole; inlining it would make the function always exit.
    return [] if isinstance(node.body[-1], EXITS) else list(node.body)


def _negated(test: ast.expr) -> ast.expr:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    return ast.UnaryOp(ast.Not(), test)


MUTATORS: tuple[Mutator, ...] = (
    Mutator(
        "flip_comparison",
        lambda n, p, f: isinstance(n, ast.Compare) and type(n.ops[0]) in COMPARE_FLIP,
        lambda n, s: ast.Compare(n.left, [COMPARE_FLIP[type(n.ops[0])](), *n.ops[1:]], n.comparators),
    ),
    Mutator(
        "change_constant",
        lambda n, p, f: isinstance(n, ast.Constant) and type(n.value) in (int, bool),
        lambda n, s: ast.Constant(not n.value) if type(n.value) is bool else int_node(n.value + _delta(s)),
    ),
    Mutator("off_by_one", _is_index, lambda n, s: shifted(n, _delta(s))),
    Mutator(
        "swap_operands",
        lambda n, p, f: (isinstance(n, ast.BinOp) and isinstance(n.op, NON_COMMUTATIVE) and _differs(n.left, n.right))
        or (isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ORDERED_COMPARE)
            and _differs(n.left, n.comparators[0])),
        lambda n, s: ast.BinOp(n.right, n.op, n.left) if isinstance(n, ast.BinOp)
        else ast.Compare(n.comparators[0], n.ops, [n.left]),
    ),
    Mutator(
        "negate_condition",
        lambda n, p, f: f == "test" and isinstance(p, (ast.If, ast.While, ast.IfExp)),
        lambda n, s: _negated(n),
    ),
    Mutator("remove_condition", lambda n, p, f: _is_plain_if(n, p, f) and not n.orelse, _remove_condition),
    Mutator(
        "invert_if_else",
        lambda n, p, f: _is_plain_if(n, p, f) and bool(n.orelse)
        and not (len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If)),
        lambda n, s: [ast.If(n.test, n.orelse, n.body)],
    ),
    Mutator(
        "remove_assignment",
        lambda n, p, f: isinstance(n, (ast.Assign, ast.AugAssign))
        or (isinstance(n, ast.AnnAssign) and n.value is not None),
        lambda n, s: [],
    ),
    Mutator(
        "break_boolean",
        lambda n, p, f: isinstance(n, ast.BoolOp),
        lambda n, s: ast.BoolOp(ast.Or() if isinstance(n.op, ast.And) else ast.And(), n.values),
    ),
    Mutator(
        "drop_return_value",
        lambda n, p, f: isinstance(n, ast.Return) and n.value is not None
        and not (isinstance(n.value, ast.Constant) and n.value.value is None),
        lambda n, s: [ast.Return()],
    ),
    Mutator(
        "change_operator",
        lambda n, p, f: isinstance(n, (ast.BinOp, ast.AugAssign)) and type(n.op) in OPERATOR_CHANGE,
        lambda n, s: ast.BinOp(n.left, OPERATOR_CHANGE[type(n.op)](), n.right) if isinstance(n, ast.BinOp)
        else [ast.AugAssign(n.target, OPERATOR_CHANGE[type(n.op)](), n.value)],
    ),
)
MUTATION_KINDS: tuple[str, ...] = tuple(m.kind for m in MUTATORS)
MUTATORS_BY_KIND = {m.kind: m for m in MUTATORS}
