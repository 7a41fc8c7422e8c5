"""A CEL parser producing a small AST with source offsets.

The engines do the authoritative parsing and type checking; this tree exists so that we
can reason about an expression ourselves, whichever engine runs it: which parts of the
device it reads (memoization), which domains it names, its worst-case cost, and which
features an engine lacks.

Size: a recursive-descent parser reads best as one file; its grammar is not split by concern.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from controller.cel.errors import CompileError


@dataclass(frozen=True, slots=True)
class Node:
    pos: int


@dataclass(frozen=True, slots=True)
class Literal(Node):
    value: object
    kind: str  # int, uint, double, string, bytes, bool, null


@dataclass(frozen=True, slots=True)
class Ident(Node):
    name: str


@dataclass(frozen=True, slots=True)
class Select(Node):
    operand: Node
    field: str
    optional: bool = False
    end: int = -1  # offset just past the field name


@dataclass(frozen=True, slots=True)
class Index(Node):
    operand: Node
    index: Node
    optional: bool = False
    end: int = -1  # offset just past the closing bracket


@dataclass(frozen=True, slots=True)
class Call(Node):
    """Function or operator call. Operators use cel-go names: _+_, _&&_, !_, _?_:_, @in ..."""

    name: str
    args: tuple[Node, ...]
    target: Node | None = None


@dataclass(frozen=True, slots=True)
class ListLit(Node):
    items: tuple[Node, ...]
    optional_items: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class MapLit(Node):
    entries: tuple[tuple[Node, Node], ...]
    optional_entries: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class StructLit(Node):
    type_name: str
    fields: tuple[tuple[str, Node], ...] = field(default_factory=tuple)


_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|//[^\n]*)
  | (?P<string>[rR]?[bB]?[rR]?
        (?:\"\"\"(?:[^\\]|\\.)*?\"\"\"|'''(?:[^\\]|\\.)*?'''|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:[0-9]+\.[0-9]+|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?[uU]?)
  | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<op>\.\?|\[\?|==|!=|<=|>=|&&|\|\||[-+*/%!<>?:.,()\[\]{}])
    """,
    re.VERBOSE | re.DOTALL,
)

_RESERVED = {
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
}
_RELATIONS = {"<": "_<_", "<=": "_<=_", ">": "_>_", ">=": "_>=_", "==": "_==_", "!=": "_!=_", "in": "@in"}
MAX_DEPTH = 250


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    pos: int


def position(source: str, offset: int) -> tuple[int, int]:
    """1-based line and column (in code points) of an offset."""
    line = source.count("\n", 0, offset) + 1
    column = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return line, column


class ParseFailure(CompileError):
    """Our parser rejected the expression (engines may still have the final word)."""


def syntax_error(source: str, offset: int, message: str) -> CompileError:
    line, column = position(source, offset)
    return ParseFailure(f"Syntax error: {message}", line=line, column=column)


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    offset = 0
    while offset < len(source):
        match = _TOKEN.match(source, offset)
        if match is None:
            raise syntax_error(source, offset, f"token recognition error at: '{source[offset]}'")
        kind = match.lastgroup or ""
        if kind == "ident" and match.group() in ("true", "false", "null", "in"):
            kind = match.group() if match.group() == "in" else "literal"
        if kind != "ws":
            tokens.append(Token(kind, match.group(), offset))
        offset = match.end()
    tokens.append(Token("eof", "", len(source)))
    return tokens


class Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = tokenize(source)
        self.at = 0
        self.depth = 0

    # --- helpers -------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.at + ahead, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.tokens[self.at]
        self.at = min(self.at + 1, len(self.tokens) - 1)
        return token

    def accept(self, text: str) -> Token | None:
        token = self.peek()
        if token.kind in ("op", "in") and token.text == text:
            return self.take()
        return None

    def expect(self, text: str) -> Token:
        token = self.accept(text)
        if token is None:
            found = self.peek()
            shown = "<EOF>" if found.kind == "eof" else found.text
            raise syntax_error(self.source, found.pos, f"mismatched input '{shown}' expecting '{text}'")
        return token

    def error(self, token: Token, message: str) -> CompileError:
        return syntax_error(self.source, token.pos, message)

    # --- grammar -------------------------------------------------------------------
    def parse(self) -> Node:
        node = self.expr()
        token = self.peek()
        if token.kind != "eof":
            raise self.error(token, f"extraneous input '{token.text}' expecting <EOF>")
        return node

    def expr(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(self.peek(), "expression recursion limit exceeded")
        condition = self.or_expr()
        question = self.accept("?")
        if question is not None:
            yes = self.or_expr()
            self.expect(":")
            no = self.expr()
            condition = Call(question.pos, "_?_:_", (condition, yes, no))
        self.depth -= 1
        return condition

    def or_expr(self) -> Node:
        node = self.and_expr()
        while (token := self.accept("||")) is not None:
            node = Call(token.pos, "_||_", (node, self.and_expr()))
        return node

    def and_expr(self) -> Node:
        node = self.relation()
        while (token := self.accept("&&")) is not None:
            node = Call(token.pos, "_&&_", (node, self.relation()))
        return node

    def relation(self) -> Node:
        node = self.addition()
        while self.peek().text in _RELATIONS and self.peek().kind in ("op", "in"):
            token = self.take()
            node = Call(token.pos, _RELATIONS[token.text], (node, self.addition()))
        return node

    def addition(self) -> Node:
        node = self.multiplication()
        while self.peek().kind == "op" and self.peek().text in ("+", "-"):
            token = self.take()
            node = Call(token.pos, f"_{token.text}_", (node, self.multiplication()))
        return node

    def multiplication(self) -> Node:
        node = self.unary()
        while self.peek().kind == "op" and self.peek().text in ("*", "/", "%"):
            token = self.take()
            node = Call(token.pos, f"_{token.text}_", (node, self.unary()))
        return node

    def unary(self) -> Node:
        token = self.peek()
        if token.kind == "op" and token.text in ("!", "-"):
            self.take()
            if token.text == "-" and self.peek().kind == "number" and self.peek().pos == token.pos + 1:
                number = self.take()
                return self.member_suffix(self.number(number, negative=True, start=token.pos))
            operand = self.unary()
            return Call(token.pos, "!_" if token.text == "!" else "-_", (operand,))
        return self.member()

    def member(self) -> Node:
        return self.member_suffix(self.primary())

    def member_suffix(self, node: Node) -> Node:
        while True:
            token = self.peek()
            if token.kind != "op":
                return node
            if token.text in (".", ".?"):
                self.take()
                name = self.take()
                if name.kind not in ("ident", "literal", "in"):
                    raise self.error(name, f"mismatched input '{name.text or '<EOF>'}' expecting IDENTIFIER")
                if token.text == "." and self.peek().text == "(" and self.peek().kind == "op":
                    self.take()
                    node = Call(name.pos, name.text, tuple(self.arguments(")")), target=node)
                else:
                    end = name.pos + len(name.text)
                    node = Select(token.pos, node, name.text, optional=token.text == ".?", end=end)
            elif token.text in ("[", "[?"):
                self.take()
                index = self.expr()
                closer = self.expect("]")
                node = Index(token.pos, node, index, optional=token.text == "[?", end=closer.pos + 1)
            elif token.text == "{" and isinstance(node, Ident | Select) and _qualified(node):
                node = self.struct(node)
            else:
                return node

    def primary(self) -> Node:
        token = self.take()
        if token.kind == "ident" or (
            token.kind == "op" and token.text == "." and self.peek().kind == "ident"
        ):
            if token.text == ".":
                token = self.take()
            if token.text in _RESERVED:
                raise self.error(token, f"reserved identifier: {token.text}")
            if self.peek().text == "(" and self.peek().kind == "op":
                self.take()
                return Call(token.pos, token.text, tuple(self.arguments(")")))
            return Ident(token.pos, token.text)
        if token.kind == "number":
            return self.number(token, negative=False, start=token.pos)
        if token.kind == "string":
            return self.string(token)
        if token.kind == "literal":
            value = {"true": True, "false": False, "null": None}[token.text]
            return Literal(token.pos, value, "null" if value is None else "bool")
        if token.kind == "op" and token.text == "(":
            node = self.expr()
            self.expect(")")
            return node
        if token.kind == "op" and token.text in ("[", "[?"):
            # `[?` is one token (it also opens an optional index): here a list with an optional first item.
            return self.list_literal(token, first_optional=token.text == "[?")
        if token.kind == "op" and token.text == "{":
            return self.map_literal(token)
        shown = "<EOF>" if token.kind == "eof" else token.text
        raise self.error(token, f"mismatched input '{shown}' expecting an expression")

    def arguments(self, closer: str) -> list[Node]:
        args: list[Node] = []
        if self.accept(closer):
            return args
        while True:
            args.append(self.expr())
            if self.accept(closer):
                return args
            self.expect(",")

    def list_literal(self, opener: Token, *, first_optional: bool = False) -> Node:
        items: list[Node] = []
        optional: list[int] = [0] if first_optional else []
        while first_optional or not self.accept("]"):
            if first_optional:
                first_optional = False
            elif self.accept("?"):
                optional.append(len(items))
            items.append(self.expr())
            if not self.accept(","):
                self.expect("]")
                break
        return ListLit(opener.pos, tuple(items), tuple(optional))

    def map_literal(self, opener: Token) -> Node:
        entries: list[tuple[Node, Node]] = []
        optional: list[int] = []
        while not self.accept("}"):
            if self.accept("?"):
                optional.append(len(entries))
            key = self.expr()
            self.expect(":")
            entries.append((key, self.expr()))
            if not self.accept(","):
                self.expect("}")
                break
        return MapLit(opener.pos, tuple(entries), tuple(optional))

    def struct(self, name: Node) -> Node:
        opener = self.expect("{")
        fields: list[tuple[str, Node]] = []
        while not self.accept("}"):
            self.accept("?")
            key = self.take()
            if key.kind != "ident":
                raise self.error(key, "expecting a field name")
            self.expect(":")
            fields.append((key.text, self.expr()))
            if not self.accept(","):
                self.expect("}")
                break
        return StructLit(opener.pos, _qualified(name) or "", tuple(fields))

    def number(self, token: Token, *, negative: bool, start: int) -> Node:
        text = token.text
        sign = -1 if negative else 1
        try:
            if text[-1] in "uU":
                if negative:
                    raise self.error(token, "unsigned literal may not be negative")
                value = int(text[:-1], 16 if text[:2].lower() == "0x" else 10)
                if value >= 2**64:
                    raise self.error(token, "invalid uint literal")
                return Literal(start, value, "uint")
            if text[:2].lower() == "0x":
                value = sign * int(text, 16)
            elif re.fullmatch(r"[0-9]+", text):
                value = sign * int(text)
            else:
                return Literal(start, sign * float(text), "double")
        except ValueError:
            raise self.error(token, f"invalid number literal {text}") from None
        if not -(2**63) <= value < 2**63:
            raise self.error(token, "invalid int literal")
        return Literal(start, value, "int")

    def string(self, token: Token) -> Node:
        text = token.text
        prefix_end = 0
        while text[prefix_end] in "rRbB":
            prefix_end += 1
        prefix = text[:prefix_end].lower()
        quote = (
            text[prefix_end : prefix_end + 3]
            if text[prefix_end : prefix_end + 3] in ('"""', "'''")
            else text[prefix_end]
        )
        body = text[prefix_end + len(quote) : len(text) - len(quote)]
        raw = "r" in prefix
        try:
            value = body if raw else _unescape(body)
        except ValueError as err:
            raise self.error(token, str(err)) from None
        if "b" in prefix:
            return Literal(token.pos, value.encode("utf-8", "surrogatepass"), "bytes")
        return Literal(token.pos, value, "string")


def _qualified(node: Node) -> str | None:
    if isinstance(node, Ident):
        return node.name
    if isinstance(node, Select) and not node.optional:
        base = _qualified(node.operand)
        return f"{base}.{node.field}" if base else None
    return None


_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "`": "`",
    "?": "?",
}


def _unescape(body: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError("invalid escape sequence")
        code = body[i + 1]
        if code in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[code])
            i += 2
        elif code in "xX" and re.fullmatch(r"[0-9a-fA-F]{2}", body[i + 2 : i + 4]):
            out.append(chr(int(body[i + 2 : i + 4], 16)))
            i += 4
        elif code == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6]):
            out.append(chr(int(body[i + 2 : i + 6], 16)))
            i += 6
        elif code == "U" and re.fullmatch(r"[0-9a-fA-F]{8}", body[i + 2 : i + 10]):
            out.append(chr(int(body[i + 2 : i + 10], 16)))
            i += 10
        elif re.fullmatch(r"[0-3][0-7]{2}", body[i + 1 : i + 4]):
            out.append(chr(int(body[i + 1 : i + 4], 8)))
            i += 4
        else:
            raise ValueError(f"invalid escape sequence \\{code}")
    return "".join(out)


@lru_cache(maxsize=256)
def parse(source: str) -> Node:
    """The AST of a CEL expression, or CompileError with line and column.

    Cached: compiling one selector parses it in several places (analysis, release checks,
    literal types, the fast path), and the tree is immutable.
    """
    return Parser(source).parse()


def children(node: Node) -> list[Node]:
    if isinstance(node, Select):
        return [node.operand]
    if isinstance(node, Index):
        return [node.operand, node.index]
    if isinstance(node, Call):
        return ([node.target] if node.target is not None else []) + list(node.args)
    if isinstance(node, ListLit):
        return list(node.items)
    if isinstance(node, MapLit):
        return [part for entry in node.entries for part in entry]
    if isinstance(node, StructLit):
        return [value for _, value in node.fields]
    return []


def walk(node: Node) -> list[Node]:
    """Every node, parents before children (iterative: deep trees must not blow the stack)."""
    out: list[Node] = []
    stack = [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(reversed(children(current)))
    return out
