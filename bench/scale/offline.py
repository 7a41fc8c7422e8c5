"""The offline side: `dra-controller explain` and `simulate` run as a user runs them, beside the
floor any Python tool pays, parsing the same objects as JSON with the standard library.

Every figure is one command, started as a child process and timed from spawn to exit (wall)
with its peak RSS and CPU time from its own rusage:

- floor: the fastest of three runs of `python -c` that json.loads every file of the JSON twin
  of the objects (one JSON List per file, as bench.fleet writes them): interpreter start plus
  the parse, every object kept (as a tool that works on them all must keep them), nothing else.
- explain: the fastest of three runs of `dra-controller explain unfittable --objects FILE...` on
  the YAML files (the same count as the floor's, so that a busy moment on shared cores counts
  against neither side): the fleet's slices, the chart's DeviceClasses and one claim that fits
  on no node (bench.fleet), so every node is accounted for. Exit 1 (not allocatable) is its
  expected answer. Beside the JSON floor (the issue's figure), beside the YAML floor (the same
  files parsed by PyYAML's libyaml loader, what any Python tool reading YAML pays), and the same
  explain on the JSON files.
- explain's start-up: the fastest of three runs of `dra-controller explain --help`, the
  interpreter and the imports explain needs, no object read.
- simulate: `dra-controller simulate --objects DIR -o json` on the YAML files with N pending
  claims and one pod per claim; every claim must come back allocated, no device twice.
- simulate of one claim on the same fleet: what loading and set-up cost, so that
  (simulate N - simulate 1) / (N - 1) is the time per claim (the per-claim table).

The fleet is written once per size, in both formats, each case adding its claims file
(bench.scale.fixtures.FleetPair); every file is read once untimed, so each command finds them
in the page cache. The files are passed to `--objects` one by one (1,002 paths at 1,000 nodes).

The project's modules are compiled to bytecode first (`compile_bytecode`), as `pip install`
does for an installed package and as Python itself does on a module's first import: where
PYTHONDONTWRITEBYTECODE is set (as on the machines this runs on), a checkout would otherwise
compile every module from source in every run, about 80 ms of start-up no user pays, while the
floor's standard library is compiled already. No input is cached: every run parses its files.
"""

from __future__ import annotations

import compileall
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.fleet import Format
from bench.scale.fixtures import FleetPair, Objects
from bench.scale.runs import Measured, RunError, run_timed
from dracommon.subcommands import EXIT_FAILURE, EXIT_OK

CLI = str(Path(sys.executable).parent / "dra-controller")
UNFIT_CLAIM = "unfittable"
TIMEOUT_S = 1800.0
FLOOR_TRIES = 3
FLOOR_CODE = {
    # Every object is kept, as a tool that works on them all at once must keep them.
    "json": (
        "import json, sys\n"
        "kept = []\n"
        "for path in sys.argv[1:]:\n"
        "    with open(path, 'rb') as handle:\n"
        "        kept.append(json.load(handle))\n"
    ),
    # libyaml's loader where the wheel has it, as a careful YAML reader would use.
    "yaml": (
        "import sys, yaml\n"
        "loader = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)\n"
        "kept = []\n"
        "for path in sys.argv[1:]:\n"
        "    with open(path, 'rb') as handle:\n"
        "        kept.append(list(yaml.load_all(handle, Loader=loader)))\n"
    ),
}


@dataclass(frozen=True)
class Case:
    """One command beside the floor on the same objects."""

    nodes: int
    gpus: int
    claims: int
    devices: int
    files: int
    yaml_bytes: int
    ours: Measured
    floor: Measured


def parse_floor(paths: list[Path], fmt: Format = "json", tries: int = FLOOR_TRIES) -> Measured:
    """The fastest of `tries` runs: the floor is cheap, and the least disturbed run is the floor."""
    runs = []
    for _ in range(tries):
        done = run_timed([sys.executable, "-c", FLOOR_CODE[fmt], *map(str, paths)], TIMEOUT_S)
        if done.returncode != 0:
            raise RunError(f"the {fmt} floor exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        runs.append(done)
    return min(runs, key=lambda r: r.wall_s)


# The packages `dra-controller` imports (bench's own run in the parent process).
PROJECT_PACKAGES = ("controller", "dracommon")
REPO_ROOT = Path(__file__).resolve().parents[2]


def compile_bytecode(root: Path = REPO_ROOT) -> None:
    """Every module of the project's packages compiled to its __pycache__, as an install does;
    untimed. A module already compiled and unchanged is left as it is."""
    for package in PROJECT_PACKAGES:
        if not compileall.compile_dir(root / package, quiet=1):
            raise RunError(f"compiling {root / package} to bytecode failed")


def explain_unfit(paths: list[Path], tries: int = FLOOR_TRIES) -> Measured:
    """The fastest of `tries` runs, each of which must answer "not allocatable"."""
    command = [CLI, "explain", UNFIT_CLAIM, "--namespace", "default", "--objects", *map(str, paths)]
    runs = []
    for _ in range(tries):
        done = run_timed(command, TIMEOUT_S)
        if done.returncode != EXIT_FAILURE or UNFIT_CLAIM not in done.stdout:
            raise RunError(
                f"explain exited {done.returncode} (expected {EXIT_FAILURE}, not allocatable): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )
        runs.append(done)
    return min(runs, key=lambda r: r.wall_s)


def allocation_problems(output: str, claims: int) -> list[str]:
    """What is wrong with simulate's JSON answer for `claims` claims that all fit (empty: nothing)."""
    answer = json.loads(output)["claims"]
    problems = [] if len(answer) == claims else [f"{len(answer)} claims in the answer, expected {claims}"]
    used: set[tuple[str, str, str]] = set()
    for entry in answer:
        if not entry["allocated"]:
            problems.append(f"{entry['name']}: not allocated: {entry.get('reason')}")
        for result in entry["results"]:
            device = (result["driver"], result["pool"], result["device"])
            if device in used:
                problems.append(f"{entry['name']}: {'/'.join(device)} allocated twice")
            used.add(device)
    return problems


def simulate_all(paths: list[Path], claims: int) -> Measured:
    done = run_timed([CLI, "simulate", "-o", "json", "--objects", *map(str, paths)], TIMEOUT_S)
    if done.returncode != EXIT_OK:
        raise RunError(f"simulate exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    problems = allocation_problems(done.stdout, claims)
    if problems:
        raise RunError(f"simulate's placements are wrong: {problems[:3]} ({len(problems)} problems)")
    return done


def _case(fleet: FleetPair, objects: Objects, claims: int, ours: Measured, floor: Measured) -> Case:
    return Case(fleet.nodes, fleet.gpus, claims, objects.devices, objects.files, objects.bytes, ours, floor)


@dataclass(frozen=True)
class ExplainCases:
    """explain on the YAML files beside the JSON floor (the issue's figure), the same command
    beside the YAML floor (libyaml's parse of those files), and explain on the JSON files."""

    yaml: Case
    yaml_floor: Measured
    json: Case
    # `dra-controller explain --help`: interpreter start and explain's imports, no object read
    startup: Measured


def measure_explain(fleet: FleetPair) -> ExplainCases:
    compile_bytecode()
    yaml, twin = fleet.explain_case("yaml"), fleet.explain_case("json")
    floor = parse_floor(twin.paths)
    on_yaml = _case(fleet, yaml, 1, explain_unfit(yaml.paths), floor)
    on_json = _case(fleet, twin, 1, explain_unfit(twin.paths), floor)
    return ExplainCases(on_yaml, parse_floor(yaml.paths, "yaml"), on_json, cli_startup())


def cli_startup(tries: int = FLOOR_TRIES) -> Measured:
    """The fastest of `tries` runs of `dra-controller explain --help`: what explain pays before
    it reads a file (a command imports only its own subcommand's modules)."""
    runs = []
    for _ in range(tries):
        done = run_timed([CLI, "explain", "--help"], TIMEOUT_S)
        if done.returncode != EXIT_OK:
            raise RunError(f"explain --help exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        runs.append(done)
    return min(runs, key=lambda r: r.wall_s)


def measure_simulate(fleet: FleetPair, claims: int) -> tuple[Case, Measured]:
    """simulate of `claims` beside the floor, and simulate of one claim on the same fleet."""
    yaml, twin, one = (
        fleet.simulate_case(claims, "yaml"),
        fleet.simulate_case(claims, "json"),
        fleet.simulate_case(1, "yaml"),
    )
    compile_bytecode()
    floor = parse_floor(twin.paths)
    ours = simulate_all(yaml.paths, claims)
    return _case(fleet, yaml, claims, ours, floor), simulate_all(one.paths, 1)


def per_claim_ms(many: Measured, one: Measured, claims: int) -> float:
    """Time per claim once loaded: the difference of N claims and one claim on the same fleet."""
    return max(many.wall_s - one.wall_s, 0.0) / (claims - 1) * 1000 if claims > 1 else many.wall_s * 1000
