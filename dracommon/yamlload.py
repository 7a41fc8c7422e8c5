"""YAML documents parsed fast, with exactly PyYAML's `safe_load_all` results and errors.

Manifests at fleet size (1,000 nodes' ResourceSlices, about 6 MB of YAML) took seconds in
PyYAML's pure scanner, and still several in its libyaml-backed `CSafeLoader`, whose nodes are
resolved and constructed one by one in Python. So there are three paths, fastest first:

1. The block-style subset `yaml.safe_dump` writes (what `draplugin devices`, `kubectl get -o
   yaml` and most tools print): block mappings and sequences, single-line plain and quoted
   scalars, `[]`/`{}`, full-line comments, `---`. A line is tokenized once per distinct text
   (lines repeat across devices and files); plain scalars get their tag from PyYAML's own
   resolver's patterns (copied below, `_IMPLICIT_PATTERNS`) and their value from its
   SafeConstructor, so `0012`, `1:20`, `yes`, `~` or dates come out exactly as PyYAML makes
   them. Strings, null, booleans and plain decimal integers are made here; PyYAML (about 9 ms
   to import, a tenth of explain's start-up) is imported only for the other tags and for paths
   2 and 3. A plain scalar continued on more indented lines (`yaml.safe_dump` wraps long ones
   at its width, CEL selectors say) is folded onto one line first, quoted, where PyYAML's
   folding is one space per line break (`_fold_plain`). Anything else outside the subset
   (anchors, tags, block scalars, flow collections, other multi-line scalars, escapes, odd
   indentation, ...) makes the whole text take path 2, never a guess. The documents are
   written as JSON text, each line adding what one lookup (by the line and the state of the
   blocks open before it) says, and the json module's C parser builds the dicts and lists:
   building them in Python took most of this path's time. A text with a key or value JSON
   cannot carry (a date, a key that is not a string) is built as a tree of Python objects
   instead, from the same tokens.
2. `CSafeLoader` where the PyYAML wheel has libyaml (`yaml.__with_libyaml__`), else the pure
   `SafeLoader`. libyaml accepts a tab as separation where the pure scanner refuses it
   (`a:<TAB>1`), so a text with a tab goes to the pure loader: results never depend on the
   wheel.
3. On any error the pure `SafeLoader` parses again, so the message (and `ManifestError`'s text)
   is the one PyYAML's scanner has always given; libyaml words several errors differently.

The subset's equality with PyYAML is checked by tests/unit/test_objects_loading.py (generated
documents, edge cases, bench.fleet's files and every YAML file of the repository).
"""

from __future__ import annotations

import json
import re
from functools import cache
from json.encoder import encode_basestring as _json_string
from typing import Any

__all__ = ["c_loader", "load_all", "yaml_error"]


@cache
def _yaml() -> Any:
    """PyYAML, imported on first need: most manifests need none of it (see path 1)."""
    import yaml

    return yaml


def c_loader() -> Any:
    """libyaml's `CSafeLoader` where the PyYAML wheel has it, else None."""
    yaml = _yaml()
    return getattr(yaml, "CSafeLoader", None) if yaml.__with_libyaml__ else None


def yaml_error() -> type[Exception]:
    """`yaml.YAMLError`, what `load_all` raises, for an `except` clause (evaluated only when
    something is raised, so a load that succeeds imports no PyYAML)."""
    error: type[Exception] = _yaml().YAMLError
    return error


# What PyYAML's Reader refuses (its NON_PRINTABLE), plus what path 1 leaves alone: tabs and
# carriage returns (line breaks and separation PyYAML treats specially), NEL and the Unicode
# line separators (line breaks to PyYAML), and a byte-order mark.
_NOT_SUBSET = "[^\x0a\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
# The same for ASCII text: compiling the whole class takes milliseconds, where most texts are ASCII.
_NOT_SUBSET_ASCII = re.compile("[^\x0a\x20-\x7e]")


@cache
def _not_subset() -> re.Pattern[str]:
    return re.compile(_NOT_SUBSET)


def _outside_subset(text: str) -> bool:
    """A character PyYAML refuses or treats specially in `text` (_NOT_SUBSET)."""
    if text.isascii():
        return _NOT_SUBSET_ASCII.search(text) is not None
    return _not_subset().search(text) is not None


# Plain scalars cannot start with these (PyYAML's scanner), or path 1 does not take them.
_BAD_FIRST = frozenset("[]{}#&*!|>%@`,'\"")


class _NotSubset(Exception):
    """The text is outside path 1's subset: parse it with PyYAML."""


# Token kinds. A token is (indent, kind, key, value); `value` of a scalar is final, except the
# two empty collections, which are made fresh where used (they are mutable).
_ENTRY = 0  # key: scalar
_OPEN = 1  # key:   (a block, or null)
_ITEM = 2  # "-"    (its content follows as tokens of its own, or it is null)
_ITEM_SCALAR = 3  # - scalar
_BARE = 4  # a scalar alone on its line (a document that is one scalar)
_EMPTY_LIST = object()
# PyYAML's scanner takes a key on one line only within 1,024 characters; leave long ones to it.
_SIMPLE_KEY_LIMIT = 1000
_EMPTY_DICT = object()

_STR_TAG = "tag:yaml.org,2002:str"
_UNKNOWN = object()
# PyYAML's implicit resolvers (yaml/resolver.py, `Resolver.add_implicit_resolver`, unchanged
# since PyYAML 5.1), in the order it registers them, by the first character they apply to:
# `Resolver.resolve` tries those of the scalar's first character in that order and takes the
# first match; a scalar none matches is a str. tests/unit/test_objects_loading.py checks the
# tags and values against PyYAML's resolver and constructor on generated scalars.
_IMPLICIT_PATTERNS: tuple[tuple[str, str, str], ...] = (
    (
        "bool",
        r"""^(?:yes|Yes|YES|no|No|NO
                    |true|True|TRUE|false|False|FALSE
                    |on|On|ON|off|Off|OFF)$""",
        "yYnNtTfFoO",
    ),
    (
        "float",
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""",
        "-+0123456789.",
    ),
    (
        "int",
        r"""^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+
                    |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$""",
        "-+0123456789",
    ),
    ("merge", r"^(?:<<)$", "<"),
    (
        "null",
        r"""^(?: ~
                    |null|Null|NULL
                    | )$""",
        "~nN",
    ),
    (
        "timestamp",
        r"""^(?:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]
                    |[0-9][0-9][0-9][0-9] -[0-9][0-9]? -[0-9][0-9]?
                     (?:[Tt]|[ \t]+)[0-9][0-9]?
                     :[0-9][0-9] :[0-9][0-9] (?:\.[0-9]*)?
                     (?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?)$""",
        "0123456789",
    ),
    ("value", r"^(?:=)$", "="),
    ("yaml", r"^(?:!|&|\*)$", "!&*"),
)
_BOOL_VALUES = {"yes": True, "no": False, "true": True, "false": False, "on": True, "off": False}
# An int as SafeConstructor.construct_yaml_int reads it without its special forms (no "_",
# base prefix, leading zero or sexagesimal part): then `int(text)` is its value.
_PLAIN_DECIMAL = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")


@cache
def _implicit() -> dict[str, tuple[tuple[str, re.Pattern[str]], ...]]:
    """First character -> (tag, pattern) in resolution order; compiled on first use."""
    # Those PyYAML spells over several lines are compiled verbose (re.X), as it compiles them.
    compiled = [(f"tag:yaml.org,2002:{name}", re.compile(pattern, re.X if "\n" in pattern else 0), firsts)
                for name, pattern, firsts in _IMPLICIT_PATTERNS]  # fmt: skip
    table: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
    for tag, pattern, firsts in compiled:
        for first in firsts:
            table.setdefault(first, []).append((tag, pattern))
    return {first: tuple(entries) for first, entries in table.items()}


_IMPLICIT_FIRSTS = frozenset("".join(firsts for _, _, firsts in _IMPLICIT_PATTERNS))


def _resolve(text: str) -> str:
    """The tag PyYAML's `Resolver.resolve(ScalarNode, text, (True, False))` gives a non-empty
    plain scalar."""
    for tag, pattern in _implicit().get(text[0], ()):
        if pattern.match(text):
            return tag
    return _STR_TAG


@cache
def _constructor() -> Any:
    return _yaml().constructor.SafeConstructor()


def _construct(tag: str, text: str) -> Any:
    """SafeConstructor's value of the plain scalar `text` resolved to `tag` (not str)."""
    if tag == "tag:yaml.org,2002:null":
        return None
    if tag == "tag:yaml.org,2002:bool":
        return _BOOL_VALUES[text.lower()]
    if tag == "tag:yaml.org,2002:int" and _PLAIN_DECIMAL.fullmatch(text):
        return int(text)
    yaml = _yaml()
    try:
        return _constructor().construct_object(yaml.nodes.ScalarNode(tag, text))
    except yaml.YAMLError as err:  # e.g. "=" (the value tag has no safe constructor)
        raise _NotSubset(text) from err


_plain_values: dict[str, Any] = {}
_line_tokens: dict[str, tuple[tuple[int, int, Any, Any], ...]] = {}
# Both caches only ever hold immutable values; bounded so a stream of unique lines cannot grow them.
_CACHE_LIMIT = 200_000


def _plain(text: str) -> Any:
    """A plain scalar's value as PyYAML resolves and constructs it."""
    known = _plain_values.get(text, _UNKNOWN)  # not KeyError: most lines seen once have new values
    if known is not _UNKNOWN:
        return known
    if not text:
        raise _NotSubset("an empty key")  # ": b"
    first = text[0]
    if first in _BAD_FIRST or (first in "-?:" and (len(text) == 1 or text[1] == " ")):
        raise _NotSubset(text)
    if ": " in text or " #" in text or text[-1] == ":":
        raise _NotSubset(text)
    tag = _resolve(text) if first in _IMPLICIT_FIRSTS else _STR_TAG
    if tag == _STR_TAG:
        value: Any = text  # what SafeConstructor.construct_yaml_str returns, without its machinery
    else:
        value = _construct(tag, text)
        if isinstance(value, list | dict | bytes | bytearray | set):
            raise _NotSubset(text)  # not from an implicit plain tag; keep the cache immutable
    if len(_plain_values) < _CACHE_LIMIT:
        _plain_values[text] = value
    return value


def _scalar(text: str) -> Any:
    """A value on one line: quoted without escapes, `[]`, `{}`, or plain."""
    first = text[0]
    if first == "'":
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != "'" or "'" in inner.replace("''", ""):
            raise _NotSubset(text)
        return inner.replace("''", "'")
    if first == '"':
        inner = text[1:-1]
        if len(text) < 2 or text[-1] != '"' or '"' in inner or "\\" in inner:
            raise _NotSubset(text)
        return inner
    if text == "[]":
        return _EMPTY_LIST
    if text == "{}":
        return _EMPTY_DICT
    return _plain(text)


def _is_item(text: str) -> bool:
    return text[0] == "-" and (len(text) == 1 or text[1] == " ")


def _entry(indent: int, text: str) -> tuple[int, int, Any, Any]:
    """One mapping entry (`key: value` or `key:`) or a bare scalar, as a token."""
    first = text[0]
    if first in "'\"":
        end = text.find(first, 1)
        while first == "'" and end != -1 and text[end + 1 : end + 2] == "'":
            end = text.find(first, end + 2)
        if end == -1 or text[end + 1 : end + 2] != ":":
            return (indent, _BARE, None, _scalar(text))
        key = _scalar(text[: end + 1])
        rest = text[end + 2 :]
        if rest and rest[0] != " ":
            raise _NotSubset(text)
    else:
        at = text.find(": ")
        if at == -1:
            if text[-1] != ":":
                return (indent, _BARE, None, _scalar(text))
            key, rest = _plain(text[:-1]), ""
        else:
            key, rest = _plain(text[:at]), text[at + 2 :]
    rest = rest.lstrip(" ")
    if len(text) - len(rest) > _SIMPLE_KEY_LIMIT:
        raise _NotSubset("long key")
    if key == "<<":
        raise _NotSubset(text)  # a merge key: the constructor's business
    if not rest:
        return (indent, _OPEN, key, None)
    if rest[0] == "#":
        raise _NotSubset(text)
    return (indent, _ENTRY, key, _scalar(rest))


def _tokens(line: str) -> tuple[tuple[int, int, Any, Any], ...]:
    """The tokens of one line (right-stripped, not blank, no comment line)."""
    stripped = line.lstrip(" ")
    indent = len(line) - len(stripped)
    tokens: list[tuple[int, int, Any, Any]] = []
    while _is_item(stripped):
        rest = stripped[1:].lstrip(" ")
        if not rest:
            tokens.append((indent, _ITEM, None, None))
            return tuple(tokens)
        column = indent + len(stripped) - len(rest)
        if _is_item(rest):
            raise _NotSubset(line)  # "- - x": nested sequences on one line
        entry = _entry(column, rest)
        if entry[1] == _BARE:
            tokens.append((indent, _ITEM_SCALAR, None, entry[3]))
        else:
            tokens.append((indent, _ITEM, None, None))
            tokens.append(entry)
        return tuple(tokens)
    tokens.append(_entry(indent, stripped))
    return tuple(tokens)


def _documents(text: str) -> list[list[tuple[int, int, Any, Any]]]:
    documents: list[list[tuple[int, int, Any, Any]]] = []
    current: list[tuple[int, int, Any, Any]] = []
    started = False
    cache = _line_tokens
    for raw in text.split("\n"):
        line = raw.rstrip(" ")
        if not line:
            continue
        found = cache.get(line)
        if found is None:
            first = line[0]
            if first == "-" and line == "---":
                if current or started:
                    if not current:
                        raise _NotSubset("empty document")
                    documents.append(current)
                current = []
                started = True
                continue
            if first in "%." and (first == "%" or line.startswith("...")):
                raise _NotSubset(line)  # directives, document end markers
            if line.lstrip(" ")[0] == "#":
                continue
            if line.startswith("--- ") or line.startswith("---\t"):
                raise _NotSubset(line)
            found = _tokens(line)
            if len(cache) < _CACHE_LIMIT:
                cache[line] = found
        current.extend(found)
    if current:
        documents.append(current)
    elif started:
        raise _NotSubset("empty document")
    return documents


def _fresh(value: Any) -> Any:
    if value is _EMPTY_LIST:
        return []
    if value is _EMPTY_DICT:
        return {}
    return value


def _node(tokens: list[tuple[int, int, Any, Any]], i: int) -> tuple[Any, int]:
    """The block that starts at token i (a mapping, a sequence or a bare scalar)."""
    indent, kind, _, value = tokens[i]
    if kind in (_ITEM, _ITEM_SCALAR):
        return _sequence(tokens, i, indent)
    if kind == _BARE:
        i += 1
        if i < len(tokens) and tokens[i][0] > indent:
            raise _NotSubset("multi-line scalar")
        return _fresh(value), i
    return _mapping(tokens, i, indent)


def _mapping(tokens: list[tuple[int, int, Any, Any]], i: int, indent: int) -> tuple[dict[Any, Any], int]:
    out: dict[Any, Any] = {}
    count = len(tokens)
    while i < count:
        at, kind, key, value = tokens[i]
        if at != indent:
            if at > indent:
                raise _NotSubset("indentation")  # a continuation, or an error PyYAML words
            break
        i += 1
        if kind == _ENTRY:
            out[key] = _fresh(value)
        elif kind == _OPEN:
            if i < count and tokens[i][0] > indent:
                out[key], i = _node(tokens, i)
            elif i < count and tokens[i][0] == indent and tokens[i][1] in (_ITEM, _ITEM_SCALAR):
                out[key], i = _sequence(tokens, i, indent)  # an indentless sequence
            else:
                out[key] = None
        elif kind in (_ITEM, _ITEM_SCALAR):
            return out, i - 1
        else:
            raise _NotSubset("scalar in a mapping")
    return out, i


def _sequence(tokens: list[tuple[int, int, Any, Any]], i: int, indent: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    count = len(tokens)
    while i < count:
        at, kind, _, value = tokens[i]
        if at != indent:
            if at > indent:
                raise _NotSubset("indentation")
            break
        if kind == _ITEM_SCALAR:
            out.append(_fresh(value))
            i += 1
            continue
        if kind != _ITEM:
            break
        i += 1
        if i < count and tokens[i][0] > indent:
            item, i = _node(tokens, i)
            out.append(item)
        else:
            out.append(None)
    return out, i


def _load_subset(text: str) -> list[Any]:
    if _outside_subset(text):
        raise _NotSubset("characters PyYAML treats specially")
    out = []
    for tokens in _documents(text):
        value, end = _node(tokens, 0)
        if end != len(tokens):
            raise _NotSubset("more than one block at the top")
        out.append(value)
    return out


# ----- path 1, as JSON: the subset's documents written as JSON text for the json module's C parser.
# Building the dicts and lists in Python was most of path 1's time; here each line is one lookup
# of what it adds to the JSON text, keyed by the line and the state of the open blocks before it
# (lines and states repeat across devices and files), and the json module builds the objects.


class _NotJson(_NotSubset):
    """In the subset, but with a key or value JSON does not carry (a date, a key not a string)."""


# The blocks open on the stack: (indent, kind); a scalar alone under a key or "-" is a block too.
_MAP, _SEQ, _SCALAR = 0, 1, 2
_CLOSE = ("}", "]", "")
# (a document written before, "---" seen, the open blocks, the key or "-" (indent, token kind)
# whose value is not seen yet, nothing written yet in the innermost block)
_State = tuple[bool, bool, tuple[tuple[int, int], ...], tuple[int, int] | None, bool]
_START: _State = (False, False, (), None, False)
_state_ids: dict[_State, int] = {_START: 0}
_states: list[_State] = [_START]
# Per state: line -> (the JSON text it adds, the table of the state after it); each table holds its
# state's number under the key None (no line is None).
_Table = dict[str | None, Any]
_tables: list[_Table] = [{None: 0}]
# Per state: the text of a line up to its value ("    uuid: ", a plain key's entry) -> the JSON text
# before the value and the table after it. Most lines seen once are such entries (UUIDs, names),
# and their key, indentation and state repeat: only the value is new.
_templates: list[dict[str, tuple[str, _Table]]] = [{}]
_steps_kept = 0


_JSON_CONSTANTS = {
    id(None): "null",
    id(True): "true",
    id(False): "false",
    id(_EMPTY_LIST): "[]",
    id(_EMPTY_DICT): "{}",
}


def _json_value(value: Any) -> str:
    kind = value.__class__
    if kind is str:
        return _json_string(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        return json.dumps(value)  # inf and nan as the json module writes and reads them
    constant = _JSON_CONSTANTS.get(id(value))
    if constant is None:
        raise _NotJson(repr(value))  # dates and timestamps
    return constant


def _json_key(key: Any) -> str:
    if key.__class__ is not str:
        raise _NotJson(repr(key))  # 1: x, true: y, ~: z
    return _json_string(key)


def _member(
    stack: list[tuple[int, int]], token: tuple[int, int, Any, Any], fresh: bool, out: list[str]
) -> tuple[int, int] | None:
    """The token as the next member of the innermost block (at its indent); the pending key or
    "-", if the token leaves one."""
    at, kind, key, value = token
    comma = "" if fresh else ","
    block = stack[-1][1]
    if block == _MAP:
        if kind == _ENTRY:
            out.append(f"{comma}{_json_key(key)}:{_json_value(value)}")
            return None
        if kind == _OPEN:
            out.append(f"{comma}{_json_key(key)}:")
            return (at, _OPEN)
        raise _NotSubset("not a mapping entry")  # an item or a scalar among a mapping's keys
    if block == _SEQ:
        if kind == _ITEM_SCALAR:
            out.append(f"{comma}{_json_value(value)}")
            return None
        if kind == _ITEM:
            out.append(comma)
            return (at, _ITEM)
        if len(stack) > 1 and stack[-2] == (at, _MAP):  # the end of an indentless sequence
            stack.pop()
            out.append("]")
            return _member(stack, token, False, out)
    raise _NotSubset("indentation")


def _open(
    stack: list[tuple[int, int]], token: tuple[int, int, Any, Any], out: list[str]
) -> tuple[int, int] | None:
    """A block that starts with the token (a document's, or a value's); the pending key or "-"."""
    at, kind, _, value = token
    if kind == _BARE:
        stack.append((at, _SCALAR))
        out.append(_json_value(value))
        return None
    if kind in (_ITEM, _ITEM_SCALAR):
        stack.append((at, _SEQ))
        out.append("[")
    else:
        stack.append((at, _MAP))
        out.append("{")
    return _member(stack, token, True, out)


def _feed(
    stack: list[tuple[int, int]],
    pending: tuple[int, int] | None,
    fresh: bool,
    written: bool,
    token: tuple[int, int, Any, Any],
    out: list[str],
) -> tuple[tuple[int, int] | None, bool]:
    """One token, as `_node`, `_mapping` and `_sequence` take it; (pending, fresh) after it."""
    at, kind = token[0], token[1]
    if not stack:  # the document's first token
        out.append("," if written else "")
        return _open(stack, token, out), False
    if pending is not None:
        pending_at, pending_kind = pending
        if at > pending_at or (pending_kind == _OPEN and at == pending_at and kind in (_ITEM, _ITEM_SCALAR)):
            return _open(stack, token, out), False  # its value: a block (or an indentless sequence)
        out.append("null")
        fresh = False
    while stack[-1][0] > at:
        _, block = stack.pop()
        if not stack:
            raise _NotSubset("more than one block at the top")
        out.append(_CLOSE[block])
        fresh = False
    if stack[-1][0] < at:
        raise _NotSubset("indentation")
    return _member(stack, token, fresh, out), False


def _document_end(stack: tuple[tuple[int, int], ...], pending: tuple[int, int] | None) -> str:
    return ("null" if pending is not None else "") + "".join(_CLOSE[block] for _, block in reversed(stack))


def _intern(state: _State) -> _Table:
    found = _state_ids.get(state)
    if found is None:
        found = _state_ids[state] = len(_states)
        _states.append(state)
        _tables.append({None: found})
        _templates.append({})
    return _tables[found]


def _value_start(line: str) -> int:
    """Where the value after a line's first ": " begins; 0 without one."""
    at = line.find(": ")
    if at < 0:
        return 0
    start, end = at + 2, len(line)
    while start < end and line[start] == " ":
        start += 1
    return start if start < end else 0


def _learn(table: _Table, raw: str) -> tuple[str, _Table]:
    """What the line adds to the JSON text in the table's state, and the state after it (kept)."""
    global _steps_kept
    if _outside_subset(raw):  # each line is checked once: every character is on some line
        raise _NotSubset("characters PyYAML treats specially")
    line = raw.rstrip(" ")
    start = line.find(": ") + 2  # _value_start, inline for its common case: one space
    if start == 1 or start == len(line) or line[start] == " ":
        start = _value_start(line)
    template = _templates[table[None]].get(line[:start]) if start else None
    if template is not None and line[start] != "#":
        # The same key in the same state: only the value is new (as `_entry` reads it). A text
        # that begins as a learned entry is no marker, directive or comment line.
        step = (template[0] + _json_value(_scalar(line[start:])), template[1])
    else:
        step = _learn_line(table, line, start)
    if _steps_kept < _CACHE_LIMIT:
        table[raw] = step
        _steps_kept += 1
    return step


def _learn_line(table: _Table, line: str, start: int) -> tuple[str, _Table]:
    """`_learn` of a line (right-stripped) with no known entry before its value at `start`."""
    written, started, blocks, pending, fresh = _states[table[None]]
    step: tuple[str, _Table]
    if not line:
        step = ("", table)
    elif line == "---":
        if blocks:
            step = (_document_end(blocks, pending), _intern((True, True, (), None, False)))
        elif started:
            raise _NotSubset("empty document")
        else:
            step = ("", _intern((written, True, (), None, False)))
    elif line[0] == "%" or line.startswith("..."):
        raise _NotSubset(line)  # directives, document end markers
    elif line.lstrip(" ")[0] == "#":
        step = ("", table)
    elif line.startswith("--- ") or line.startswith("---\t"):
        raise _NotSubset(line)
    else:
        stack = list(blocks)
        out: list[str] = []
        tokens = _tokens(line)
        for token in tokens:
            pending, fresh = _feed(stack, pending, fresh, written, token, out)
        step = ("".join(out), _intern((written, started, tuple(stack), pending, fresh)))
        prefix = line[:start]
        if start and tokens[-1][1] == _ENTRY and "'" not in prefix and '"' not in prefix:
            # A plain key: its value is the text from `start` on (`_entry` splits at the first ": ").
            value = _json_value(tokens[-1][3])
            templates = _templates[table[None]]
            if step[0].endswith(value) and len(templates) < _CACHE_LIMIT:
                templates[prefix] = (step[0][: len(step[0]) - len(value)], step[1])
    return step


# Runs: stretches of lines stepped one by one before (each line known in its state), kept by the
# table they start from and their first line, with the JSON text they add and the table after
# them. Files of one shape (1,000 nodes' slices) repeat every stretch between their lines seen
# once (names, UUIDs): one list comparison in C then replays a stretch of dozens of lines, where
# a lookup per line was most of reading them. The same lines from the same state always add the
# same text and end in the same state, so a replay is exactly the steps it stands for.
_Run = tuple[list[str], str, _Table]
_runs: dict[tuple[int, str, str, str, str], list[_Run]] = {}
_runs_kept = 0
_RUN_MIN = 4  # shorter stretches cost less line by line than kept and compared
# Runs hold their lines: bounded far below the line caches (1,000 nodes of 5 models keep 64).
_RUNS_LIMIT = 20_000
# Stretches that start alike and go on differently (GPU models of one memory size, say).
_RUNS_PER_START = 8


def _run_key(lines: list[str], at: int, table: _Table) -> tuple[int, str, str, str, str]:
    """Runs are kept by their state and first _RUN_MIN lines (`at` + 3 < len(lines)): after a
    GPU's UUID the stretches of a fleet go on alike for a line or two, then by its index and model."""
    return (id(table), lines[at], lines[at + 1], lines[at + 2], lines[at + 3])


def _replay(lines: list[str], at: int, table: _Table) -> _Run | None:
    """The longest kept run that `lines` continue with from `at` in the table's state, if any."""
    if at + _RUN_MIN > len(lines):
        return None
    found = _runs.get(_run_key(lines, at, table))
    if found is not None:
        for run in found:  # longest first
            if lines[at : at + len(run[0])] == run[0]:
                return run
    return None


def _keep_run(
    lines: list[str], start: int, end: int, table: _Table, after: _Table, parts: list[str], first: int
) -> None:
    """Keep lines[start:end], stepped from the table's state to `after`'s (runs replayed inside
    it too), whose text is parts[first:]."""
    global _runs_kept
    if end - start < _RUN_MIN or _runs_kept >= _RUNS_LIMIT:
        return
    kept = _runs.setdefault(_run_key(lines, start, table), [])
    kept.append((lines[start:end], "".join(parts[first:]), after))
    kept.sort(key=lambda run: -len(run[0]))
    _runs_kept += 1 - len(kept[_RUNS_PER_START:])  # the shortest beyond the limit go
    del kept[_RUNS_PER_START:]


def _load_as_json(text: str) -> list[Any]:
    """Path 1 through JSON text: `_load_subset`'s documents (or its _NotSubset), or _NotJson."""
    parts: list[str] = []
    append = parts.append
    table = _tables[0]
    lines = text.split("\n")
    count = len(lines)
    # The stretch since the last learned line: from line `start`, in `start_table`'s state, its
    # text from parts[`first_part`] on. A kept run is looked for where a stretch starts; a
    # stretch that was not one kept run is kept, so the next file of its shape replays it.
    start, start_table, first_part, replayed = 0, table, 0, False
    at = 0
    while at < count:
        line = lines[at]
        if at == start:
            run = _replay(lines, at, table)
            if run is not None:
                append(run[1])
                table = run[2]
                at += len(run[0])
                replayed = True
                continue
        step = table.get(line)
        if step is None:
            if not (replayed and len(parts) == first_part + 1):
                _keep_run(lines, start, at, start_table, table, parts, first_part)
            fragment, table = _learn(table, line)
            append(fragment)
            at += 1
            start, start_table, first_part, replayed = at, table, len(parts), False
            continue
        fragment, table = step
        append(fragment)
        at += 1
    if not (replayed and len(parts) == first_part + 1):
        _keep_run(lines, start, at, start_table, table, parts, first_part)
    _, started, blocks, pending, _ = _states[table[None]]
    if blocks:
        append(_document_end(blocks, pending))
    elif started:
        raise _NotSubset("empty document")
    documents: list[Any] = json.loads(f"[{''.join(parts)}]")
    return documents


# ----- multi-line plain scalars: `yaml.safe_dump` wraps a long one (a CEL selector) at its width.


def _plain_start(line: str, token: tuple[int, int, Any, Any]) -> int:
    """Where the line's last token, an entry's or an item's value, begins as a plain scalar
    (not quoted, `[]`, `{}`); 0 where it is not one or is not found so simply."""
    if token[1] == _ENTRY:
        stripped = line.lstrip(" -")
        if stripped[:1] in ("'", '"'):
            return 0  # a quoted key: leave it to PyYAML
        start = _value_start(line)
    elif token[1] == _ITEM_SCALAR:
        start = line.find("-") + 1
        while start < len(line) and line[start] == " ":
            start += 1
    else:
        return 0
    if not start or start >= len(line) or line[start] in "'\"" or line[start:] in ("[]", "{}"):
        return 0
    return start


def _fold_plain(text: str) -> str | None:
    """`text` with each plain scalar continued on more indented lines written on one line,
    single- or double-quoted, as PyYAML folds it (a line break between two lines is one space;
    trailing and leading spaces go); None where there is none, or one this does not fold exactly
    (a blank line inside, a comment, `: ` or ` #` on a continuation line, a value PyYAML would
    resolve to another type once folded): those stay with PyYAML."""
    lines = text.split("\n")
    out: list[str] = []
    folded = False
    i = 0
    while i < len(lines):
        line = lines[i].rstrip(" ")
        i += 1
        out.append(line)
        if i >= len(lines) or not line or line.lstrip(" ")[0] == "#":
            continue
        following = lines[i].rstrip(" ")
        column = len(following) - len(following.lstrip(" "))
        if not following or column == 0 or following.lstrip(" ")[0] == "#":
            continue
        try:
            token = _tokens(line)[-1]
        except _NotSubset:
            return None
        if column <= token[0]:
            continue  # the next line is no continuation: a sibling's, or a parent's
        start = _plain_start(line, token)
        if not start:
            continue  # a block opens (more indentation is its content), or not a plain value
        parts = [line[start:]]
        while i < len(lines):
            more = lines[i].rstrip(" ")
            stripped = more.lstrip(" ")
            if not stripped or len(more) - len(stripped) <= token[0]:
                break
            if stripped[0] == "#" or ": " in stripped or " #" in stripped or stripped[-1] == ":":
                return None
            parts.append(stripped)
            i += 1
        if i < len(lines) and not lines[i].strip(" ") and i + 1 < len(lines):
            after = lines[i + 1].rstrip(" ")
            if len(after) - len(after.lstrip(" ")) > token[0] and after.strip(" "):
                return None  # a blank line inside the scalar: a line break, not a space
        value = " ".join(parts)
        if value[0] in _BAD_FIRST or ": " in value or " #" in value:
            return None
        if value[0] in _IMPLICIT_FIRSTS and _resolve(value) != _STR_TAG:
            return None
        if '"' in value or "\\" in value:
            out[-1] = line[:start] + "'" + value.replace("'", "''") + "'"
        else:
            out[-1] = line[:start] + '"' + value + '"'
        folded = True
    return "\n".join(out) if folded else None


def load_all(text: str) -> list[Any]:
    """Every document of `text`, as `list(yaml.safe_load_all(text))` gives them; raises the
    `yaml.YAMLError` that call raises."""
    try:
        return _load_as_json(text)
    except _NotJson:
        try:
            return _load_subset(text)
        except _NotSubset:
            pass
    except _NotSubset:
        folded = _fold_plain(text) if not _outside_subset(text) else None
        if folded is not None:
            try:
                return _load_as_json(folded)
            except _NotJson:
                try:
                    return _load_subset(folded)
                except _NotSubset:
                    pass
            except _NotSubset:
                pass
    yaml = _yaml()
    loader = c_loader()
    if loader is not None and "\t" not in text:
        try:
            return list(yaml.load_all(text, Loader=loader))
        except yaml.YAMLError:
            pass  # parse again below for the pure scanner's message
    return list(yaml.load_all(text, Loader=yaml.SafeLoader))
