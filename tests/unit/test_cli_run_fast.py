"""`draplugin run`'s own flag reader (`cli.run_flags`, which spares the start building argparse's
parser) gives what argparse gives for every command line it takes, and leaves the others to
argparse."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from pathlib import Path

import pytest

from draplugin import cli, config

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOLEANS = [option.flag for option in config.RUN_OPTIONS if option.boolean]
VALUED = [option.flag for option in config.RUN_OPTIONS if not option.boolean]
VALUES = ["x", "", "a b", "a=b", "1", "/tmp/k", "true", "false", "--"]


def _argparse(words: list[str]) -> dict[str, str | None]:
    parser = argparse.ArgumentParser(prog="draplugin run", allow_abbrev=False)
    cli._add_run_arguments(parser)
    return vars(parser.parse_args(words))


def _random_line(rng: random.Random) -> list[str]:
    words: list[str] = []
    for _ in range(rng.randrange(0, 8)):
        if rng.random() < 0.3:
            flag = rng.choice(BOOLEANS)
            form = rng.randrange(3)
            if form == 0:
                words.append(flag)
            elif form == 1:
                words.append(f"{flag}={rng.choice(['true', 'false', 'x', ''])}")
            else:
                words += [flag, rng.choice(["true", "false", "x"])]
        else:
            flag = rng.choice(VALUED)
            value = rng.choice(VALUES)
            if rng.random() < 0.5:
                words.append(f"{flag}={value}")
            elif not value.startswith("-"):
                words += [flag, value]
    return words


def test_every_line_it_takes_reads_as_argparse_reads_it() -> None:
    rng = random.Random(31)
    taken = 0
    for _ in range(3000):
        words = _random_line(rng)
        flags = cli.run_flags(words)
        if flags is not None:
            taken += 1
            assert flags == _argparse(words), words
    assert taken > 2500  # the lines of known flags and plain values are all taken


@pytest.mark.parametrize(
    "words",
    [
        ["--node-name", "n", "--delete-slices-on-shutdown"],
        ["--delete-slices-on-shutdown", "--node-name=n"],
        ["--delete-slices-on-shutdown", "false", "--partitionable-mig"],
        ["--node-name", "n1", "--node-name=n2"],  # the last one wins
        ["--metrics-port=-1"],
        [],
    ],
)
def test_switches_repeats_and_values_as_argparse(words: list[str]) -> None:
    assert cli.run_flags(words) == _argparse(words)


@pytest.mark.parametrize(
    "words",
    [
        ["--help"],
        ["-h"],
        ["--node"],  # no abbreviations in either
        ["--no-such-flag=1"],
        ["--node-name"],  # a value is missing: argparse's usage error
        ["--node-name", "--backend=fake"],
        ["--metrics-port", "-1"],  # a value that starts with a dash: argparse decides
        ["--delete-slices-on-shutdown", "-x"],
        ["--"],
        ["extra"],
        ["--node-name=n", "--x y"],
        ["--node-name=--"],
    ],
)
def test_anything_else_is_left_to_argparse(words: list[str]) -> None:
    assert cli.run_flags(words) is None


def test_main_serves_a_line_it_takes_through_run(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, str | None]] = []

    def fake_run(flags: dict[str, str | None]) -> int:
        seen.append(flags)
        return 7

    def no_argparse(words: list[str]) -> int:
        raise AssertionError(f"argparse's parser was built for {words}")

    monkeypatch.setattr(cli, "_run_with", fake_run)
    monkeypatch.setattr(cli.RUN_LINE, "main", no_argparse)
    assert cli.main(["run", "--node-name=n", "--delete-slices-on-shutdown"]) == 7
    (flags,) = seen
    assert flags == _argparse(["--node-name=n", "--delete-slices-on-shutdown"])


def test_run_and_the_parsers_leave_argparse_unimported_until_needed() -> None:
    code = (
        "import sys\n"
        "import draplugin.cli\n"
        "assert 'argparse' not in sys.modules\n"
        "draplugin.cli.run_flags(['--node-name=n'])\n"
        "assert 'argparse' not in sys.modules\n"
        "draplugin.cli.RUN_LINE.build_parser()\n"
        "assert 'argparse' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
