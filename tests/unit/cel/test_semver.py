"""SemVer 2.0.0 parsing, normalization and precedence of controller.cel.semver."""

from __future__ import annotations

import itertools

import pytest

from controller.cel.semver import Semver, SemverError, is_semver


def test_parse_parts() -> None:
    version = Semver.parse("550.54.15")
    assert (version.major, version.minor, version.patch, version.prerelease) == (550, 54, 15, ())
    assert Semver.parse("1.0.0-rc.1+build.5").prerelease == ("rc", "1")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Version string empty"),
        ("1.2", "No Major.Minor.Patch elements found"),
        ("v1.2.3", "Invalid character(s) found in major number"),
        ("01.2.3", "Major number must not contain leading zeroes"),
        ("1.02.3", "Minor number must not contain leading zeroes"),
        ("1.2.x", "Invalid character(s) found in patch number"),
        ("1.2.3-", "Prerelease is empty"),
        ("1.2.3-01", "must not contain leading zeroes"),
        ("1.2.3-a_b", "Invalid character(s) found in prerelease"),
        ("1.2.3+", "Build meta data is empty"),
        ("1.2.3+a..b", "Build meta data is empty"),
    ],
)
def test_strict_parse_errors(text: str, message: str) -> None:
    with pytest.raises(SemverError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Semver.parse(text)
    assert not is_semver(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v1.2.3", "1.2.3"),
        ("1.2", "1.2.0"),
        ("v3", "3.0.0"),
        ("1.02.003", "1.2.3"),
        ("v1.0-rc.1", "1.0.0-rc.1"),
    ],
)
def test_normalize(text: str, expected: str) -> None:
    assert Semver.parse(text, normalize=True) == Semver.parse(expected)
    assert is_semver(text, True)


@pytest.mark.parametrize(
    "ordered",
    [
        [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "1.1.0",
            "2.0.0",
            "10.0.0",
        ],
    ],
)
def test_precedence_follows_semver_spec(ordered: list[str]) -> None:
    versions = [Semver.parse(text) for text in ordered]
    for low, high in itertools.pairwise(versions):
        assert low.compare(high) == -1
        assert high.compare(low) == 1
        assert low.compare(low) == 0


def test_build_metadata_is_ignored() -> None:
    assert Semver.parse("1.0.0+a") == Semver.parse("1.0.0+b")
    assert Semver.parse("1.0.0+a").canonical() == "1.0.0"
    assert Semver.from_canonical(Semver.parse("2.1.0-rc.1+x").canonical()) == Semver.parse("2.1.0-rc.1")
