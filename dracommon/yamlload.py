"""YAML documents parsed fast, with exactly PyYAML's `safe_load_all` results and errors.

Manifests at fleet size (1,000 nodes' ResourceSlices, about 6 MB of YAML) took seconds in
PyYAML's pure scanner, and still several in its libyaml-backed `CSafeLoader`, whose nodes are
resolved and constructed one by one in Python. So there are three paths, fastest first:

1. The block-style subset `yaml.safe_dump` writes (what `draplugin devices`, `kubectl get -o
   yaml` and most tools print): block mappings and sequences, single-line plain and quoted
   scalars, `[]`/`{}`, full-line comments, `---`. A line is tokenized once per distinct text
   (lines repeat across devices and files); plain scalars get their tag from PyYAML's own
   resolver and their value from its SafeConstructor, so `0012`, `1:20`, `yes`, `~` or dates
   come out exactly as PyYAML makes them. Anything outside the subset (anchors, tags, block
   scalars, flow collections, multi-line scalars, escapes, odd indentation, ...) makes the
   whole text take path 2, never a guess. The documents are written as JSON text, each line
   adding what one lookup (by the line and the state of the blocks open before it) says, and
   the json module's C parser builds the dicts and lists: building them in Python took most of
   this path's time. A text with a key or value JSON cannot carry (a date, a key that is not a
   string) is built as a tree of Python objects instead, from the same tokens.
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

import yaml
from yaml.nodes import ScalarNode

__all__ = ["C_LOADER", "load_all"]

C_LOADER: Any = getattr(yaml, "CSafeLoader", None) if yaml.__with_libyaml__ else None

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

_resolver = yaml.resolver.Resolver()
_STR_TAG = "tag:yaml.org,2002:str"
_UNKNOWN = object()
_constructor = yaml.constructor.SafeConstructor()
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
    tag = _resolver.resolve(ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    if tag == _STR_TAG:
        value: Any = text  # what SafeConstructor.construct_yaml_str returns, without its machinery
    else:
        try:
            value = _constructor.construct_object(ScalarNode(tag, text))
        except yaml.YAMLError as err:  # e.g. "=" (the value tag has no safe constructor)
            raise _NotSubset(text) from err
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


def _load_as_json(text: str) -> list[Any]:
    """Path 1 through JSON text: `_load_subset`'s documents (or its _NotSubset), or _NotJson."""
    parts: list[str] = []
    append = parts.append
    table = _tables[0]
    for line in text.split("\n"):
        try:
            fragment, table = table[line]
        except KeyError:
            fragment, table = _learn(table, line)
        append(fragment)
    _, started, blocks, pending, _ = _states[table[None]]
    if blocks:
        append(_document_end(blocks, pending))
    elif started:
        raise _NotSubset("empty document")
    documents: list[Any] = json.loads(f"[{''.join(parts)}]")
    return documents


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
        pass
    if C_LOADER is not None and "\t" not in text:
        try:
            return list(yaml.load_all(text, Loader=C_LOADER))
        except yaml.YAMLError:
            pass  # parse again below for the pure scanner's message
    return list(yaml.load_all(text, Loader=yaml.SafeLoader))
