"""Writing a mutated function back into its file while changing as few lines as possible.

An edit is tried from the narrowest (the mutated expression or statement) to the widest
(the whole function re-rendered by `ast.unparse`); the first whose re-parsed function
equals the mutated AST wins. Text outside the function is never touched, so comments,
decorators and formatting elsewhere stay byte-identical, and the bug does not give itself
away by a function that suddenly lost its comments.
"""

from __future__ import annotations

import ast
import copy
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.synthesis.mutation_kinds import NodePath, Replacement, node_at
from pipeline.synthesis.pyparse import parse_python

FuncNode = ast.FunctionDef | ast.AsyncFunctionDef
OP_TOKENS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitAnd: "&",
    ast.BitXor: "^", ast.MatMult: "@", ast.And: "and", ast.Or: "or", ast.Eq: "==", ast.NotEq: "!=",
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Is: "is", ast.IsNot: "is not",
    ast.In: "in", ast.NotIn: "not in",
}
OP_PATTERNS = {
    op: r"\b" + r"\s+".join(token.split()) + r"\b" if token[0].isalpha() else re.escape(token)
    for op, token in OP_TOKENS.items()
}


@dataclass(frozen=True)
class Span:
    """A text range: (0-based line, character column) to (line, column), end exclusive."""

    start: tuple[int, int]
    end: tuple[int, int]


def source_lines(text: str) -> list[str]:
    """Lines with their own endings kept (\\n, \\r\\n or \\r), split as the tokenizer does."""
    return io.StringIO(text, newline="").readlines()


@dataclass(frozen=True)
class Style:
    """How the file lays out new lines: its line ending and one level of indentation."""

    newline: str
    indent_unit: str


def style_of(lines: list[str], func: FuncNode) -> Style:
    """The line ending of the file's first line and the indentation step of func's body."""
    first = lines[0] if lines else "\n"
    newline = "\r\n" if first.endswith("\r\n") else "\r" if first.endswith("\r") else "\n"
    unit = _indent_of(lines, func.body[0])[len(_indent_of(lines, func)) :]
    return Style(newline, unit if unit and not unit.strip() else "    ")


def replaced(lines: list[str], span: Span, text: str) -> str:
    """The file text with span replaced by text."""
    (l0, c0), (l1, c1) = span.start, span.end
    return "".join(lines[:l0]) + lines[l0][:c0] + text + lines[l1][c1:] + "".join(lines[l1 + 1 :])


def _char_col(line: str, byte_col: int) -> int:
    # ast columns count UTF-8 bytes, str slicing counts characters.
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def node_span(lines: list[str], node: ast.AST) -> Span:
    """Where node's text lies."""
    l0, l1 = node.lineno - 1, node.end_lineno - 1
    return Span((l0, _char_col(lines[l0], node.col_offset)), (l1, _char_col(lines[l1], node.end_col_offset)))


def statement_span(lines: list[str], node: ast.AST) -> Span | None:
    """node's span from the start of its first line, or None when it shares a line with other code."""
    span = node_span(lines, node)
    (l0, c0), (l1, c1) = span.start, span.end
    tail = lines[l1][c1:].strip()
    if lines[l0][:c0].strip() or (tail and not tail.startswith("#")):
        return None
    return Span((l0, 0), span.end)


def _indent_of(lines: list[str], node: ast.AST) -> str:
    start = node_span(lines, node).start
    return lines[start[0]][: start[1]]


def _original_text(lines: list[str], node: ast.stmt, indent: str) -> str | None:
    """node's own text moved to indent, or None when it shares a line with other code."""
    span = statement_span(lines, node)
    if span is None:
        return None
    old = _indent_of(lines, node)
    body = lines[span.start[0] : span.end[0]] + [lines[span.end[0]][: span.end[1]]]
    moved = [indent + body[0][len(old) :]]
    moved += [indent + line[len(old) :] if line.startswith(old) and line.strip() else line for line in body[1:]]
    return "".join(moved)


def _has_position(node: ast.AST) -> bool:
    return getattr(node, "lineno", None) is not None


def kept_text(stmts: list[ast.stmt], indent: str, lines: list[str], style: Style) -> str | None:
    """stmts as text reusing the original lines of every statement that has them."""
    parts: list[str] = []
    for stmt in stmts:
        if _has_position(stmt):
            text = _original_text(lines, stmt, indent)
        elif isinstance(stmt, ast.If) and stmt.orelse and all(map(_has_position, stmt.body + stmt.orelse)):
            body = kept_text(stmt.body, _indent_of(lines, stmt.body[0]), lines, style)
            orelse = kept_text(stmt.orelse, _indent_of(lines, stmt.orelse[0]), lines, style)
            nl = style.newline
            text = None if body is None or orelse is None else (
                f"{indent}if {ast.unparse(stmt.test)}:{nl}{body}{nl}{indent}else:{nl}{orelse}"
            )
        else:
            text = unparsed_text([stmt], indent, style)
        if text is None:
            return None
        parts.append(text)
    return style.newline.join(parts)


def unparsed_text(stmts: list[ast.stmt], indent: str, style: Style) -> str:
    """stmts rendered by ast.unparse at indent, in the file's indentation and line ending."""
    rendered = []
    for line in "\n".join(ast.unparse(stmt) for stmt in stmts).split("\n"):
        stripped = line.lstrip(" ")
        levels, rest = divmod(len(line) - len(stripped), 4)  # ast.unparse indents by four spaces
        rendered.append(indent + style.indent_unit * levels + " " * rest + stripped if line else "")
    return style.newline.join(rendered)


def _between(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    (l0, c0), (l1, c1) = start, end
    return lines[l0][c0:c1] if l0 == l1 else lines[l0][c0:] + "".join(lines[l0 + 1 : l1]) + lines[l1][:c1]


def _text(lines: list[str], node: ast.AST) -> str:
    span = node_span(lines, node)
    return _between(lines, span.start, span.end)


def _operands(node: ast.AST) -> tuple[list[ast.AST], list[ast.AST]] | None:
    if isinstance(node, ast.BinOp):
        return [node.left, node.right], [node.op]
    if isinstance(node, ast.BoolOp):
        return node.values, [node.op] * (len(node.values) - 1)
    if isinstance(node, ast.Compare):
        return [node.left, *node.comparators], node.ops
    return None


def _operator_text(lines: list[str], original: ast.AST, new: ast.AST) -> str | None:
    """original's text with only its operator tokens changed, when that is all that differs."""
    old_parts, new_parts = _operands(original), _operands(new)
    if type(original) is not type(new) or old_parts is None or new_parts is None:
        return None
    (operands, old_ops), (new_operands, new_ops) = old_parts, new_parts
    if list(map(ast.dump, operands)) != list(map(ast.dump, new_operands)):
        return None
    text, position = "", node_span(lines, original).start
    for left, right, old_op, new_op in zip(operands, operands[1:], old_ops, new_ops):
        gap_start, gap_end = node_span(lines, left).end, node_span(lines, right).start
        gap = _between(lines, gap_start, gap_end)
        gap = re.sub(OP_PATTERNS[type(old_op)], OP_TOKENS[type(new_op)], gap, count=1)
        text += _between(lines, position, gap_start) + gap
        position = gap_end
    return text + _between(lines, position, node_span(lines, original).end)


def expression_texts(lines: list[str], original: ast.expr, new: ast.expr) -> Iterator[str]:
    """Texts for new in place of original, keeping original text where it can."""
    if _has_position(new):  # an original subexpression, e.g. `x` from `not x`
        yield _text(lines, new)
    if isinstance(new, ast.UnaryOp) and isinstance(new.op, ast.Not) and new.operand is not None:
        if ast.dump(new.operand) == ast.dump(original):
            yield f"not {_text(lines, original)}"
            yield f"not ({_text(lines, original)})"
    operator_text = _operator_text(lines, original, new)
    if operator_text is not None:
        yield operator_text
    yield ast.unparse(new)
    yield f"({ast.unparse(new)})"


def _statement_edits(lines: list[str], node: ast.stmt, renders: list[str | None]) -> Iterator[str]:
    span = statement_span(lines, node)
    if span is None:
        return
    for text in renders:
        if text == "":
            yield "".join(lines[: span.start[0]]) + "".join(lines[span.end[0] + 1 :])
        elif text is not None:
            yield replaced(lines, span, text)


def candidate_texts(
    lines: list[str], func: FuncNode, mutated: FuncNode, site: NodePath, original: ast.AST, new: Replacement
) -> Iterator[str]:
    """File texts carrying the mutation, narrowest edit first."""
    style = style_of(lines, func)
    if isinstance(new, list):
        indent = _indent_of(lines, original)
        renders = [kept_text(new, indent, lines, style), unparsed_text(new, indent, style)]
        yield from _statement_edits(lines, original, renders)
    else:
        span = node_span(lines, original)
        for text in expression_texts(lines, original, new):
            yield replaced(lines, span, text)
    for depth in range(len(site) - 1, 0, -1):
        ancestor = node_at(func, site[:depth])
        if isinstance(ancestor, ast.stmt):
            indent = _indent_of(lines, ancestor)
            rendered = unparsed_text([node_at(mutated, site[:depth])], indent, style)
            yield from _statement_edits(lines, ancestor, [rendered])
    undecorated = copy.copy(mutated)
    undecorated.decorator_list = []
    yield from _statement_edits(lines, func, [unparsed_text([undecorated], _indent_of(lines, func), style)])


def normal_dump(func: FuncNode) -> str:
    """func's structure, decorators left out, as the parser builds it from its unparsed text."""
    undecorated = copy.copy(func)
    undecorated.decorator_list = []
    return ast.dump(parse_python(ast.unparse(undecorated)).body[0])


def reparsed_function(text: str, func: FuncNode, old_line_count: int) -> ast.AST | None:
    """The function parsed back from its own lines of text (parsing the whole file is slow)."""
    new_lines = source_lines(text)
    first = func.lineno - 1
    last = func.end_lineno - 1 + len(new_lines) - old_line_count
    segment = "".join(new_lines[first : last + 1])
    indented = new_lines[first][:1].isspace()
    try:
        tree = parse_python("class _:\n" + segment if indented else segment)
    except (SyntaxError, ValueError):
        return None
    node = tree.body[0].body[0] if indented else tree.body[0]
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def splice(
    lines: list[str], func: FuncNode, mutated: FuncNode, site: NodePath,
    original: ast.AST, new: Replacement, expected: str,
) -> str | None:
    """The file text with mutated in place of func (expected is its normal_dump), or None when no edit reproduces it."""
    seen: set[str] = set()
    for text in candidate_texts(lines, func, mutated, site, original, new):
        if text in seen:
            continue
        seen.add(text)
        node = reparsed_function(text, func, len(lines))
        if node is not None and normal_dump(node) == expected:
            return text
    return None
