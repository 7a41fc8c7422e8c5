"""Semantic versions as the Kubernetes CEL semver library sees them (SemVer 2.0.0).

Parsing is strict by default (three numeric parts, no leading zeros, no `v`), like the
Go library upstream wraps; `normalize=True` first strips a leading `v`, pads missing
minor/patch parts with zero and drops leading zeros. Build metadata is accepted and
ignored for comparison and equality.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# \Z, not $: `$` also matches before a final newline, where the Go library's check (and so cel-go's
# `isSemver("1.2.3\n")`) refuses it.
_IDENT = re.compile(r"^[0-9A-Za-z-]+\Z", re.ASCII)
_DIGITS = re.compile(r"^[0-9]+\Z", re.ASCII)


class SemverError(ValueError):
    """A string is not a valid semantic version."""


@dataclass(frozen=True, slots=True)
class Semver:
    major: int
    minor: int
    patch: int
    prerelease: tuple[str, ...] = ()

    @staticmethod
    def parse(text: str, normalize: bool = False) -> Semver:
        return _parse_cached(text, normalize)

    def canonical(self) -> str:
        """Text without build metadata: equal versions have equal canonical text."""
        core = f"{self.major}.{self.minor}.{self.patch}"
        return f"{core}-{'.'.join(self.prerelease)}" if self.prerelease else core

    @staticmethod
    def from_canonical(text: str) -> Semver:
        return _parse_cached(text, False)

    def compare(self, other: Semver) -> int:
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return 1 if mine > theirs else -1
        return _compare_prerelease(self.prerelease, other.prerelease)

    def __str__(self) -> str:
        return self.canonical()


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        _parse_cached(text, normalize)
    except SemverError:
        return False
    return True


def _compare_prerelease(left: tuple[str, ...], right: tuple[str, ...]) -> int:
    # A version without pre-release parts ranks above any pre-release of it.
    if not left or not right:
        return (not left) - (not right)
    for a, b in zip(left, right, strict=False):
        if a == b:
            continue
        a_num, b_num = a.isdigit(), b.isdigit()
        if a_num and b_num:
            return 1 if int(a) > int(b) else -1
        if a_num != b_num:
            return -1 if a_num else 1
        return 1 if a > b else -1
    return (len(left) > len(right)) - (len(left) < len(right))


@lru_cache(maxsize=4096)
def _parse_cached(text: str, normalize: bool) -> Semver:
    return _parse(_normalized(text) if normalize else text)


def _normalized(text: str) -> str:
    text = text.removeprefix("v")
    cut = min((i for i in (text.find("-"), text.find("+")) if i >= 0), default=len(text))
    core, suffix = text[:cut], text[cut:]
    parts = core.split(".")
    parts += ["0"] * (3 - len(parts))
    parts = [part.lstrip("0") or "0" if len(part) > 1 else part for part in parts]
    return ".".join(parts) + suffix


def _parse(text: str) -> Semver:
    if not text:
        raise SemverError("Version string empty")
    core, plus, build = text.partition("+")
    core, dash, pre = core.partition("-")
    parts = core.split(".", 2)
    if len(parts) != 3:
        raise SemverError("No Major.Minor.Patch elements found")
    numbers = [_number(part, label) for part, label in zip(parts, ("major", "minor", "patch"), strict=True)]
    prerelease: tuple[str, ...] = ()
    if dash:
        prerelease = tuple(pre.split("."))
        for ident in prerelease:
            if not ident:
                raise SemverError("Prerelease is empty")
            if not _IDENT.match(ident):
                raise SemverError(f"Invalid character(s) found in prerelease {ident!r}")
            if _DIGITS.match(ident) and len(ident) > 1 and ident[0] == "0":
                raise SemverError(f"Prerelease version must not contain leading zeroes {ident!r}")
    if plus:
        for ident in build.split("."):
            if not ident:
                raise SemverError("Build meta data is empty")
            if not _IDENT.match(ident):
                raise SemverError(f"Invalid character(s) found in build meta data {ident!r}")
    return Semver(numbers[0], numbers[1], numbers[2], prerelease)


def _number(part: str, label: str) -> int:
    if not _DIGITS.match(part):
        raise SemverError(f"Invalid character(s) found in {label} number {part!r}")
    if len(part) > 1 and part[0] == "0":
        raise SemverError(f"{label.capitalize()} number must not contain leading zeroes {part!r}")
    value = int(part)
    if value >= 2**64:
        raise SemverError(f"{label.capitalize()} number out of range {part!r}")
    return value
