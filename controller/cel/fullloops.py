"""Checked CEL programs whose `all`/`exists` run to the end instead of stopping early.

cel-expr-python 0.1.3 (cel-cpp) leaves a comprehension's variable slots set when `all` or
`exists` stops early (its loop condition turns false once the result is known), and a later
comprehension or `cel.bind` in the same expression then reads the stale slot:
`[1, 2].exists(k, true) && [3, 1].sortBy(x, -x).size() == 2` fails with "no such overload:
<iter_range>" and `{"a": 1}.exists(k, true) && cel.bind(b, 1, b > 0)` with
"_>_(string, int64)", where cel-go answers true. Found by the evaluation corpus
(tests/integration/test_cel_corpus_eval.py).

The cure here, for expressions with two loops or more (a lone loop has nothing to spoil and
keeps its early exit, see engine_cpp._plan): every comprehension's loop condition becomes the
constant `true`, so each loop
runs to its last element and leaves through the normal exit. The result does not change: once
`all` has a false (or `exists` a true) accumulator, `false && x` stays false and `true || x`
stays true whatever `x` is, errors included, as CEL's commutative logical operators absorb
them. It costs the iterations the early exit would have saved, bounded by the range's size.

The program is edited in its serialized checked form (a google.protobuf.Any holding a
cel.expr.CheckedExpr), the only form cel-expr-python exposes, and loaded back with
`Env.deserialize`. The walk is hand-written over the protobuf wire format because the
cel.expr messages are not packaged for Python; field numbers are cel-spec's syntax.proto
and checked.proto (cel.dev/expr).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

# Wire types.
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5

# google.protobuf.Any.value; CheckedExpr.expr.
_ANY_VALUE = 2
_CHECKED_EXPR = 4
# Expr: id, then the oneof of its kinds.
_EXPR_ID = 2
_SELECT, _CALL, _LIST, _STRUCT, _COMPREHENSION = 5, 6, 7, 8, 9
_CONST = 3
# The Expr-typed fields of each kind (Select.operand; Call.target, args; CreateList.elements;
# CreateStruct.entries -> Entry.map_key, value; Comprehension.iter_range, accu_init,
# loop_condition, loop_step, result).
_SELECT_EXPRS = frozenset({1})
_CALL_EXPRS = frozenset({1, 3})
_LIST_EXPRS = frozenset({1})
_STRUCT_ENTRIES = 2
_ENTRY_EXPRS = frozenset({3, 4})
_LOOP_CONDITION = 5
_COMPREHENSION_EXPRS = frozenset({2, 4, 6, 7})
# Constant.bool_value.
_BOOL_VALUE = 2

Field = tuple[int, int, bytes]


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _fields(data: bytes) -> Iterator[Field]:
    """(field number, wire type, raw payload) of each field, in order; ValueError if malformed."""
    pos = 0
    try:
        while pos < len(data):
            key, pos = _read_varint(data, pos)
            number, wire = key >> 3, key & 7
            if wire == _VARINT:
                _, end = _read_varint(data, pos)
            elif wire == _FIXED64:
                end = pos + 8
            elif wire == _FIXED32:
                end = pos + 4
            elif wire == _BYTES:
                length, pos = _read_varint(data, pos)
                end = pos + length
            else:
                raise ValueError(f"unsupported wire type {wire}")
            if end > len(data):
                raise ValueError("truncated message")
            yield number, wire, data[pos:end]
            pos = end
    except IndexError:
        raise ValueError("truncated varint") from None


def _encode(fields: Sequence[Field]) -> bytes:
    out = bytearray()
    for number, wire, payload in fields:
        out += _varint(number << 3 | wire)
        if wire == _BYTES:
            out += _varint(len(payload))
        out += payload
    return bytes(out)


def _map_exprs(data: bytes, expr_fields: frozenset[int]) -> bytes:
    return _encode([(n, w, _expr(p) if w == _BYTES and n in expr_fields else p) for n, w, p in _fields(data)])


def _struct(data: bytes) -> bytes:
    return _encode(
        [
            (n, w, _map_exprs(p, _ENTRY_EXPRS) if w == _BYTES and n == _STRUCT_ENTRIES else p)
            for n, w, p in _fields(data)
        ]
    )


def _true_like(condition: bytes) -> bytes:
    """An Expr `true` that keeps the condition's id (its type-map entry says bool already)."""
    ids = [(n, w, p) for n, w, p in _fields(condition) if n == _EXPR_ID and w == _VARINT]
    return _encode([*ids, (_CONST, _BYTES, _encode([(_BOOL_VALUE, _VARINT, b"\x01")]))])


def _comprehension(data: bytes) -> bytes:
    out: list[Field] = []
    for number, wire, payload in _fields(data):
        if wire == _BYTES and number == _LOOP_CONDITION:
            payload = _true_like(payload)
        elif wire == _BYTES and number in _COMPREHENSION_EXPRS:
            payload = _expr(payload)
        out.append((number, wire, payload))
    return _encode(out)


def _expr(data: bytes) -> bytes:
    out: list[Field] = []
    for number, wire, payload in _fields(data):
        if wire == _BYTES:
            if number == _SELECT:
                payload = _map_exprs(payload, _SELECT_EXPRS)
            elif number == _CALL:
                payload = _map_exprs(payload, _CALL_EXPRS)
            elif number == _LIST:
                payload = _map_exprs(payload, _LIST_EXPRS)
            elif number == _STRUCT:
                payload = _struct(payload)
            elif number == _COMPREHENSION:
                payload = _comprehension(payload)
        out.append((number, wire, payload))
    return _encode(out)


def run_loops_to_the_end(serialized: bytes) -> bytes:
    """A serialized checked program (Any of CheckedExpr) with every loop condition `true`."""

    def checked(data: bytes) -> bytes:
        return _encode(
            [(n, w, _expr(p) if w == _BYTES and n == _CHECKED_EXPR else p) for n, w, p in _fields(data)]
        )

    return _encode(
        [(n, w, checked(p) if w == _BYTES and n == _ANY_VALUE else p) for n, w, p in _fields(serialized)]
    )
