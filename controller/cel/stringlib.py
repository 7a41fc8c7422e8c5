"""cel-go ext.Strings (v2 + reverse/quote), over Python strings indexed by code point."""

from __future__ import annotations

from collections.abc import Sequence

from controller.cel.errors import LibraryError, check_size
from controller.cel.semver import Semver
from dracommon.quantity import Quantity


def _out_of_range(index: int) -> LibraryError:
    return LibraryError(f"index out of range: {index}")


def char_at(text: str, index: int) -> str:
    if index < 0 or index > len(text):
        raise _out_of_range(index)
    return text[index : index + 1]


def index_of(text: str, sub: str, offset: int = 0) -> int:
    if offset < 0 or offset > len(text):
        raise _out_of_range(offset)
    return text.find(sub, offset)


def last_index_of(text: str, sub: str, offset: int | None = None) -> int:
    if offset is None:
        return text.rfind(sub)
    if offset < 0 or offset >= max(len(text), 1):
        raise _out_of_range(offset)
    return text.rfind(sub, 0, offset + len(sub))


def lower_ascii(text: str) -> str:
    return "".join(c.lower() if c.isascii() else c for c in text)


def upper_ascii(text: str) -> str:
    return "".join(c.upper() if c.isascii() else c for c in text)


def trim(text: str) -> str:
    return text.strip()


def substring(text: str, start: int, end: int | None = None) -> str:
    stop = len(text) if end is None else end
    if start < 0 or start > len(text):
        raise _out_of_range(start)
    if stop < 0 or stop > len(text):
        raise _out_of_range(stop)
    if start > stop:
        raise LibraryError(f"invalid substring range. start: {start}, end: {stop}")
    return text[start:stop]


def replace(text: str, old: str, new: str, count: int = -1) -> str:
    if count == 0:
        return text
    occurrences = text.count(old) if old else len(text) + 1
    replaced = occurrences if count < 0 else min(count, occurrences)
    check_size(len(text) + replaced * (len(new) - len(old)), "string")
    return text.replace(old, new, count)


def split(text: str, sep: str, count: int = -1) -> list[str]:
    if count == 0:
        return []
    if sep == "":
        chars = list(text)
        if 0 < count < len(chars):
            return [*chars[: count - 1], "".join(chars[count - 1 :])]
        return chars
    return text.split(sep, count - 1 if count > 0 else -1)


def join(items: Sequence[object], sep: str = "") -> str:
    if not all(isinstance(item, str) for item in items):
        raise LibraryError("join: list must contain only strings")
    result = sep.join(str(item) for item in items)
    check_size(len(result), "string")
    return result


def reverse(text: str) -> str:
    return text[::-1]


def quote(text: str) -> str:
    escapes = {
        "\a": "\\a",
        "\b": "\\b",
        "\f": "\\f",
        "\n": "\\n",
        "\r": "\\r",
        "\t": "\\t",
        "\v": "\\v",
        "\\": "\\\\",
        '"': '\\"',
    }
    return '"' + "".join(escapes.get(c, c) for c in text) + '"'


def format_string(template: str, args: Sequence[object]) -> str:
    """`"%s is %d".format([a, b])` with the verbs ext.Strings supports."""
    out: list[str] = []
    position = 0
    i = 0
    while i < len(template):
        char = template[i]
        if char != "%":
            out.append(char)
            i += 1
            continue
        i += 1
        if i < len(template) and template[i] == "%":
            out.append("%")
            i += 1
            continue
        precision: int | None = None
        if i < len(template) and template[i] == ".":
            start = i + 1
            i = start
            while i < len(template) and template[i].isdigit():
                i += 1
            precision = int(template[start:i] or "0")
        if i >= len(template):
            raise LibraryError("could not parse formatting clause: unexpected end of string")
        verb = template[i]
        i += 1
        if position >= len(args):
            raise LibraryError(f"index {position} out of range")
        out.append(_format_one(verb, args[position], precision))
        position += 1
        check_size(sum(len(part) for part in out), "string")
    return "".join(out)


def _format_one(verb: str, value: object, precision: int | None) -> str:
    if verb == "s":
        return to_cel_string(value)
    if verb == "d":
        if isinstance(value, bool) or not isinstance(value, int):
            raise LibraryError(
                "error during formatting: decimal clause can only be used on integers, was given "
                + _type_name(value)
            )
        return str(value)
    if verb in "fe":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LibraryError(
                "error during formatting: fixed-point clause can only be used on doubles, was given "
                + _type_name(value)
            )
        return f"{float(value):.{6 if precision is None else precision}{verb}}"
    if verb in "xXob":
        if isinstance(value, bool) or not isinstance(value, int | str | bytes):
            raise LibraryError(
                "error during formatting: only integers, byte buffers, and strings can be formatted as hex, "
                f"was given {_type_name(value)}"
            )
        if isinstance(value, str | bytes):
            raw = value.encode() if isinstance(value, str) else value
            hexed = raw.hex()
            return hexed.upper() if verb == "X" else hexed
        return format(value, verb)
    raise LibraryError(f'could not parse formatting clause: unrecognized formatting clause "{verb}"')


def _type_name(value: object) -> str:
    return {
        bool: "bool",
        int: "int",
        float: "double",
        str: "string",
        bytes: "bytes",
        list: "list",
        dict: "map",
    }.get(type(value), type(value).__name__)


def to_cel_string(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Quantity | Semver):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(to_cel_string(v) for v in value) + "]"
    if value is None:
        return "null"
    return str(value)
