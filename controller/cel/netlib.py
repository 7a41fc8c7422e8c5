"""Kubernetes CEL IP, CIDR and URL libraries, over Python's ipaddress and urllib."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from controller.cel.errors import LibraryError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Interface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


@dataclass(frozen=True, slots=True)
class IP:
    address: Address

    def canonical(self) -> str:
        return str(self.address)

    @staticmethod
    def from_canonical(text: str) -> IP:
        return IP(ipaddress.ip_address(text))

    def __str__(self) -> str:
        return self.canonical()


@dataclass(frozen=True, slots=True)
class CIDR:
    """A prefix that keeps its address bits (cidr("10.0.0.1/8").ip() is 10.0.0.1)."""

    interface: Interface

    def canonical(self) -> str:
        return str(self.interface)

    @staticmethod
    def from_canonical(text: str) -> CIDR:
        return CIDR(ipaddress.ip_interface(text))

    def __str__(self) -> str:
        return self.canonical()


@dataclass(frozen=True, slots=True)
class URL:
    text: str

    def canonical(self) -> str:
        return self.text

    @staticmethod
    def from_canonical(text: str) -> URL:
        return URL(text)

    def __str__(self) -> str:
        return self.text


def _parse_address(text: str) -> Address:
    if "%" in text:
        raise ValueError("IP address with zone value is not allowed")
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise ValueError("IPv4-mapped IPv6 address is not allowed")
    return address


def parse_ip(text: str) -> IP:
    try:
        return IP(_parse_address(text))
    except ValueError as err:
        raise LibraryError(f"network address parse error during conversion from string: {err}") from None


def is_ip(text: str) -> bool:
    try:
        _parse_address(text)
    except ValueError:
        return False
    return True


def is_canonical(text: str) -> bool:
    return str(parse_ip(text).address) == text


def family(ip: IP) -> int:
    return ip.address.version


def is_unspecified(ip: IP) -> bool:
    return ip.address.is_unspecified


def is_loopback(ip: IP) -> bool:
    return ip.address.is_loopback


def is_link_local_multicast(ip: IP) -> bool:
    packed = ip.address.packed
    if ip.address.version == 4:
        return packed[:3] == b"\xe0\x00\x00"
    return packed[0] == 0xFF and packed[1] & 0x0F == 0x02


def is_link_local_unicast(ip: IP) -> bool:
    packed = ip.address.packed
    if ip.address.version == 4:
        return packed[:2] == b"\xa9\xfe"
    return packed[0] == 0xFE and packed[1] & 0xC0 == 0x80


def is_global_unicast(ip: IP) -> bool:
    """Go's definition: anything routable-looking, private ranges included."""
    address = ip.address
    if address.is_unspecified or address.is_loopback or address.is_multicast or is_link_local_unicast(ip):
        return False
    return not (address.version == 4 and address == ipaddress.IPv4Address("255.255.255.255"))


def _parse_interface(text: str) -> Interface:
    if "%" in text:
        raise ValueError("CIDR with zone value is not allowed")
    if "/" not in text:
        raise ValueError(f"netip.ParsePrefix({text!r}): no '/'")
    interface = ipaddress.ip_interface(text)
    if isinstance(interface, ipaddress.IPv6Interface) and interface.ip.ipv4_mapped is not None:
        raise ValueError("IPv4-mapped IPv6 address is not allowed")
    return interface


def parse_cidr(text: str) -> CIDR:
    try:
        return CIDR(_parse_interface(text))
    except ValueError as err:
        raise LibraryError(f"network address parse error during conversion from string: {err}") from None


def is_cidr(text: str) -> bool:
    try:
        _parse_interface(text)
    except ValueError:
        return False
    return True


def cidr_ip(cidr: CIDR) -> IP:
    return IP(cidr.interface.ip)


def contains_ip(cidr: CIDR, other: IP | str) -> bool:
    ip = parse_ip(other) if isinstance(other, str) else other
    network = cidr.interface.network
    return ip.address.version == network.version and ip.address in network


def contains_cidr(cidr: CIDR, other: CIDR | str) -> bool:
    inner = parse_cidr(other) if isinstance(other, str) else other
    outer_net, inner_net = cidr.interface.network, inner.interface.network
    return outer_net.version == inner_net.version and inner_net.subnet_of(outer_net)  # type: ignore[arg-type]


def prefix_length(cidr: CIDR) -> int:
    return cidr.interface.network.prefixlen


def masked(cidr: CIDR) -> CIDR:
    return CIDR(ipaddress.ip_interface(str(cidr.interface.network)))


def parse_url(text: str) -> URL:
    problem = _url_problem(text)
    if problem:
        raise LibraryError(f"URL parse error during conversion from string: {problem}")
    return URL(text)


def is_url(text: str) -> bool:
    return _url_problem(text) is None


def _url_problem(text: str) -> str | None:
    # Go's url.ParseRequestURI: an absolute URI or an absolute path, no spaces or controls.
    if not text or any(c.isspace() or ord(c) < 0x20 for c in text):
        return f'parse "{text}": invalid URI for request'
    try:
        parts = urlsplit(text)
        _ = parts.port
    except ValueError as err:
        return f'parse "{text}": {err}'
    if not parts.scheme and not text.startswith("/"):
        return f'parse "{text}": invalid URI for request'
    return None


def get_scheme(url: URL) -> str:
    return urlsplit(url.text).scheme


def get_host(url: URL) -> str:
    return urlsplit(url.text).netloc.rpartition("@")[2]


def get_hostname(url: URL) -> str:
    host = get_host(url)
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.partition(":")[0]


def get_port(url: URL) -> str:
    host = get_host(url)
    tail = host[host.find("]") + 1 :] if host.startswith("[") else host
    return tail.partition(":")[2]


def get_escaped_path(url: URL) -> str:
    return urlsplit(url.text).path


def get_query(url: URL) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url.text).query, keep_blank_values=True)
