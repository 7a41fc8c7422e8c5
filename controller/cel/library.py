"""The Kubernetes CEL function libraries, written once in Python and shared by every engine.

Each function is a list of typed overloads over plain Python values (str, int, float, bool,
bytes, list, dict, `Quantity`, `Semver`). Engines translate their own values to and from
these and turn `LibraryError` into a CEL runtime error carrying the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from controller.cel import listlib, netlib, regexlib, stringlib
from controller.cel.errors import LibraryError
from controller.cel.semver import Semver, SemverError, is_semver
from dracommon.quantity import Quantity, QuantityError, is_quantity


class Kind(Enum):
    STRING = "string"
    INT = "int"
    UINT = "uint"
    DOUBLE = "double"
    BOOL = "bool"
    BYTES = "bytes"
    QUANTITY = "Quantity"
    SEMVER = "Semver"
    LIST = "list"
    LIST_STRING = "list(string)"
    MAP_STRING_LIST = "map(string, list(string))"
    IP = "net.IP"
    CIDR = "net.CIDR"
    URL = "kubernetes.URL"
    # Any scalar: engines with static dispatch expand this into one overload per kind.
    ANY = "any"


SCALAR_KINDS = (
    Kind.INT,
    Kind.UINT,
    Kind.DOUBLE,
    Kind.STRING,
    Kind.BOOL,
    Kind.BYTES,
    Kind.QUANTITY,
    Kind.SEMVER,
    Kind.IP,
    Kind.CIDR,
    Kind.URL,
)


@dataclass(frozen=True, slots=True)
class Overload:
    overload_id: str
    params: tuple[Kind, ...]
    result: Kind
    member: bool
    impl: Callable[..., object]


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    overloads: tuple[Overload, ...]


def _wrap(fn: Callable[..., object]) -> Callable[..., object]:
    """Turn the libraries' own parse errors into `LibraryError` with upstream text."""

    def call(*args: object) -> object:
        try:
            return fn(*args)
        except (QuantityError, SemverError) as err:
            raise LibraryError(str(err)) from None

    call.__name__ = getattr(fn, "__name__", "call")
    # Callers that treat every ValueError as a CEL error anyway (controller.cel.fastruntime) skip a layer.
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def _member(oid: str, params: Sequence[Kind], result: Kind, impl: Callable[..., object]) -> Overload:
    return Overload(oid, tuple(params), result, True, _wrap(impl))


def _global(oid: str, params: Sequence[Kind], result: Kind, impl: Callable[..., object]) -> Overload:
    return Overload(oid, tuple(params), result, False, _wrap(impl))


Q, S, INT, B, STR, D = Kind.QUANTITY, Kind.SEMVER, Kind.INT, Kind.BOOL, Kind.STRING, Kind.DOUBLE
L, LS, A = Kind.LIST, Kind.LIST_STRING, Kind.ANY


def _quantity_functions() -> list[Function]:
    return [
        Function("quantity", (_global("string_to_quantity", [STR], Q, Quantity.parse),)),
        Function("isQuantity", (_global("is_quantity_string", [STR], B, is_quantity),)),
        Function("sign", (_member("quantity_sign", [Q], INT, Quantity.sign),)),
        Function("isInteger", (_member("quantity_is_integer", [Q], B, Quantity.is_integer),)),
        Function("asInteger", (_member("quantity_get_integer", [Q], INT, Quantity.as_integer),)),
        Function(
            "asApproximateFloat", (_member("quantity_get_float", [Q], D, Quantity.as_approximate_float),)
        ),
        Function(
            "add",
            (
                _member("quantity_add", [Q, Q], Q, Quantity.add),
                _member("quantity_add_int", [Q, INT], Q, Quantity.add),
            ),
        ),
        Function(
            "sub",
            (
                _member("quantity_sub", [Q, Q], Q, Quantity.sub),
                _member("quantity_sub_int", [Q, INT], Q, Quantity.sub),
            ),
        ),
    ]


def _semver_functions() -> list[Function]:
    return [
        Function(
            "semver",
            (
                _global("string_to_semver", [STR], S, Semver.parse),
                _global("string_bool_to_semver", [STR, B], S, Semver.parse),
            ),
        ),
        Function(
            "isSemver",
            (
                _global("is_semver_string", [STR], B, is_semver),
                _global("is_semver_string_bool", [STR, B], B, is_semver),
            ),
        ),
        Function("major", (_member("semver_major", [S], INT, lambda v: v.major),)),
        Function("minor", (_member("semver_minor", [S], INT, lambda v: v.minor),)),
        Function("patch", (_member("semver_patch", [S], INT, lambda v: v.patch),)),
    ]


def _comparison_functions() -> list[Function]:
    """compareTo / isGreaterThan / isLessThan exist for both Quantity and Semver."""

    def compare(a: Quantity | Semver, b: Quantity | Semver) -> int:
        if isinstance(a, Quantity) and isinstance(b, Quantity):
            return a.compare(b)
        if isinstance(a, Semver) and isinstance(b, Semver):
            return a.compare(b)
        raise LibraryError(f"no such overload: {type(a).__name__}.compareTo({type(b).__name__})")

    functions = []
    for name, fn in (
        ("compareTo", compare),
        ("isGreaterThan", lambda a, b: compare(a, b) > 0),
        ("isLessThan", lambda a, b: compare(a, b) < 0),
    ):
        result = INT if name == "compareTo" else B
        functions.append(
            Function(
                name,
                (
                    _member(f"quantity_{name}", [Q, Q], result, fn),
                    _member(f"semver_{name}", [S, S], result, fn),
                ),
            )
        )
    return functions


def _list_functions() -> list[Function]:
    return [
        Function("isSorted", (_member("list_is_sorted", [L], B, listlib.is_sorted),)),
        Function("sum", (_member("list_sum", [L], A, listlib.sum_of),)),
        Function("min", (_member("list_min", [L], A, listlib.min_of),)),
        Function("max", (_member("list_max", [L], A, listlib.max_of),)),
        Function(
            "indexOf",
            (
                _member("list_index_of", [L, A], INT, listlib.index_of),
                _member("string_index_of", [STR, STR], INT, stringlib.index_of),
                _member("string_index_of_int", [STR, STR, INT], INT, stringlib.index_of),
            ),
        ),
        Function(
            "lastIndexOf",
            (
                _member("list_last_index_of", [L, A], INT, listlib.last_index_of),
                _member("string_last_index_of", [STR, STR], INT, stringlib.last_index_of),
                _member("string_last_index_of_int", [STR, STR, INT], INT, stringlib.last_index_of),
            ),
        ),
        # ext.Lists (v3).
        Function("slice", (_member("list_slice", [L, INT, INT], L, listlib.slice_of),)),
        Function(
            "flatten",
            (
                _member("list_flatten", [L], L, listlib.flatten),
                _member("list_flatten_depth", [L, INT], L, listlib.flatten),
            ),
        ),
        Function("distinct", (_member("list_distinct", [L], L, listlib.distinct),)),
        # ext.Strings is at version 2 upstream, so there is no string reverse().
        Function("reverse", (_member("list_reverse", [L], L, listlib.reverse),)),
        Function("sort", (_member("list_sort", [L], L, listlib.sort),)),
        Function("lists.range", (_global("lists_range", [INT], L, listlib.range_of),)),
        # Kubernetes library.Lists v1 (base environment 1.37).
        Function(
            "includes",
            (
                _member("list_includes", [L, A], B, listlib.includes),
                _member("dyn_includes", [A, A], B, listlib.includes),
            ),
        ),
        Function("sets.contains", (_global("sets_contains", [L, L], B, listlib.sets_contains),)),
        Function("sets.equivalent", (_global("sets_equivalent", [L, L], B, listlib.sets_equivalent),)),
        Function("sets.intersects", (_global("sets_intersects", [L, L], B, listlib.sets_intersects),)),
    ]


def _string_functions() -> list[Function]:
    return [
        Function("lowerAscii", (_member("string_lower_ascii", [STR], STR, stringlib.lower_ascii),)),
        Function("upperAscii", (_member("string_upper_ascii", [STR], STR, stringlib.upper_ascii),)),
        Function("trim", (_member("string_trim", [STR], STR, stringlib.trim),)),
        Function("charAt", (_member("string_char_at", [STR, INT], STR, stringlib.char_at),)),
        Function(
            "substring",
            (
                _member("string_substring", [STR, INT], STR, stringlib.substring),
                _member("string_substring_range", [STR, INT, INT], STR, stringlib.substring),
            ),
        ),
        Function(
            "replace",
            (
                _member("string_replace", [STR, STR, STR], STR, stringlib.replace),
                _member("string_replace_n", [STR, STR, STR, INT], STR, stringlib.replace),
            ),
        ),
        Function(
            "split",
            (
                _member("string_split", [STR, STR], LS, stringlib.split),
                _member("string_split_n", [STR, STR, INT], LS, stringlib.split),
            ),
        ),
        Function(
            "join",
            (
                _member("list_join", [LS], STR, stringlib.join),
                _member("list_join_sep", [LS, STR], STR, stringlib.join),
            ),
        ),
        Function("format", (_member("string_format", [STR, L], STR, stringlib.format_string),)),
        Function("strings.quote", (_global("strings_quote", [STR], STR, stringlib.quote),)),
        # Kubernetes regex library.
        Function("find", (_member("string_find", [STR, STR], STR, regexlib.find),)),
        Function(
            "findAll",
            (
                _member("string_find_all", [STR, STR], LS, regexlib.find_all),
                _member("string_find_all_n", [STR, STR, INT], LS, regexlib.find_all),
            ),
        ),
    ]


def _network_functions() -> list[Function]:
    ip, cidr, url = Kind.IP, Kind.CIDR, Kind.URL
    predicates = [
        ("isUnspecified", netlib.is_unspecified),
        ("isLoopback", netlib.is_loopback),
        ("isLinkLocalMulticast", netlib.is_link_local_multicast),
        ("isLinkLocalUnicast", netlib.is_link_local_unicast),
        ("isGlobalUnicast", netlib.is_global_unicast),
    ]
    url_parts = [
        ("getScheme", netlib.get_scheme),
        ("getHost", netlib.get_host),
        ("getHostname", netlib.get_hostname),
        ("getPort", netlib.get_port),
        ("getEscapedPath", netlib.get_escaped_path),
    ]
    return [
        Function(
            "ip",
            (
                _global("string_to_ip", [STR], ip, netlib.parse_ip),
                _member("cidr_ip", [cidr], ip, netlib.cidr_ip),
            ),
        ),
        Function("isIP", (_global("is_ip", [STR], B, netlib.is_ip),)),
        Function("ip.isCanonical", (_global("ip_is_canonical", [STR], B, netlib.is_canonical),)),
        Function("family", (_member("ip_family", [ip], INT, netlib.family),)),
        *(Function(name, (_member(f"ip_{name}", [ip], B, fn),)) for name, fn in predicates),
        Function("cidr", (_global("string_to_cidr", [STR], cidr, netlib.parse_cidr),)),
        Function("isCIDR", (_global("is_cidr", [STR], B, netlib.is_cidr),)),
        Function(
            "containsIP",
            (
                _member("cidr_contains_ip_ip", [cidr, ip], B, netlib.contains_ip),
                _member("cidr_contains_ip_string", [cidr, STR], B, netlib.contains_ip),
            ),
        ),
        Function(
            "containsCIDR",
            (
                _member("cidr_contains_cidr", [cidr, cidr], B, netlib.contains_cidr),
                _member("cidr_contains_cidr_string", [cidr, STR], B, netlib.contains_cidr),
            ),
        ),
        Function("prefixLength", (_member("cidr_prefix_length", [cidr], INT, netlib.prefix_length),)),
        Function("masked", (_member("cidr_masked", [cidr], cidr, netlib.masked),)),
        Function("url", (_global("string_to_url", [STR], url, netlib.parse_url),)),
        Function("isURL", (_global("is_url_string", [STR], B, netlib.is_url),)),
        *(Function(name, (_member(f"url_{name}", [url], STR, fn),)) for name, fn in url_parts),
        Function("getQuery", (_member("url_get_query", [url], Kind.MAP_STRING_LIST, netlib.get_query),)),
    ]


FUNCTIONS: tuple[Function, ...] = tuple(
    _quantity_functions()
    + _semver_functions()
    + _comparison_functions()
    + _list_functions()
    + _string_functions()
    + _network_functions()
)

FUNCTION_NAMES: frozenset[str] = frozenset(f.name for f in FUNCTIONS)
