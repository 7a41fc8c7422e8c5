"""Habits `draplugin` and `dra-controller` share with kubectl (dracommon.subcommands): flags
spelled out in full, an unknown flag answered with the subcommand's usage, `--version`, a quiet
end when the reader of the output goes away, shell completion, a missing kubeconfig said as
missing, and the `kubectl dra` plugin entry points."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from controller import cli as controller_cli
from controller.run.metrics import ControllerMetrics
from draplugin import cli as plugin_cli
from draplugin.metrics import ClaimMetrics

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = Path(sys.executable).parent
EXAMPLE_OBJECTS = ["examples/deviceclasses.yaml", "examples/resourceslices/", "examples/05-same-pcie-root/"]


def test_a_flag_is_never_abbreviated(capsys: pytest.CaptureFixture[str]) -> None:
    # argparse's default takes `--obj` for `--objects`: a typo would silently mean another flag.
    with pytest.raises(SystemExit) as exited:
        controller_cli.main(["simulate", "--obj", "examples/resourceslices/"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --obj" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("main", "argv", "usage"),
    [
        (controller_cli.main, ["explain", "x", "--bogus"], "usage: dra-controller explain "),
        (controller_cli.main, ["top", "--bogus"], "usage: dra-controller top "),
        (plugin_cli.main, ["devices", "--node-name", "n", "--bogus"], "usage: draplugin devices "),
    ],
)
def test_an_unknown_flag_is_answered_with_the_subcommands_usage(
    main: object, argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert callable(main)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith(usage), err
    assert f"{usage.split()[1]} {usage.split()[2]}: error: unrecognized arguments: --bogus" in err


@pytest.mark.parametrize(
    ("main", "prog"), [(controller_cli.main, "dra-controller"), (plugin_cli.main, "draplugin")]
)
def test_version_names_the_package_and_python(
    main: object, prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert callable(main)
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    expected = f"{prog} {metadata.version('draplugin')} (Python {platform.python_version()})"
    assert capsys.readouterr().out.strip() == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["dra-controller", "simulate", "--objects", *EXAMPLE_OBJECTS],
        ["dra-controller", "explain", "pod/gpu-pair", "--objects", *EXAMPLE_OBJECTS],
        ["dra-controller", "top", "--metrics-file", "docs/usage/gpu-node-1.prom"],
        ["draplugin", "devices", "--backend", "fake", "--fake-gpus", "8", "--node-name", "n"],
    ],
    ids=lambda argv: argv[1],
)
def test_output_to_a_reader_that_went_away_ends_without_a_traceback(argv: list[str]) -> None:
    # The read end is closed before the command writes: its first write fails with EPIPE
    # (Python ignores SIGPIPE), as when `head` has read its lines and exited.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [str(BIN_DIR / argv[0]), *argv[1:]],
            cwd=REPO_ROOT, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.returncode == 1


def test_a_missing_kubeconfig_is_said_to_be_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    assert controller_cli.main(["simulate"]) == 2
    err = capsys.readouterr().err
    assert f"no kubeconfig: $KUBECONFIG names {tmp_path / 'nope'}, which does not exist" in err
    assert "Invalid" not in err


def _completions(program: str, line: str, tmp_path: Path) -> list[str]:
    """What argcomplete answers the shell for `line`, asked as its bash script asks (the
    variables `register-python-argcomplete` sets; the answer goes to a file instead of fd 8)."""
    answer = tmp_path / "answer"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_IFS": "\n",
        "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
    }
    subprocess.run([str(BIN_DIR / program)], cwd=REPO_ROOT, env=env, timeout=60, check=True)
    return answer.read_text().split("\n")


@pytest.mark.parametrize(
    ("program", "line", "expected"),
    [
        ("dra-controller", "dra-controller si", ["simulate "]),
        ("dra-controller", "dra-controller explain --all", ["--all-namespaces "]),
        ("draplugin", "draplugin de", ["devices "]),
        ("kubectl-dra", "kubectl-dra ex", ["explain "]),
    ],
)
def test_shell_completion_of_a_partial_word(
    program: str, line: str, expected: list[str], tmp_path: Path
) -> None:
    assert _completions(program, line, tmp_path) == expected


def test_kubectl_plugin_completion_answers_in_cobras_format(capsys: pytest.CaptureFixture[str]) -> None:
    # kubectl runs `kubectl_complete-dra explain --nam` for `kubectl dra explain --nam<TAB>`.
    assert controller_cli.kubectl_complete(["explain", "--nam"]) == 0
    assert capsys.readouterr().out == "--namespace\n:4\n"
    assert controller_cli.kubectl_complete(["top", "-o", ""]) == 0
    assert capsys.readouterr().out.splitlines() == ["table", "wide", "json", "yaml", ":4"]


def test_kubectl_plugin_entry_points_are_installed() -> None:
    usage = subprocess.run(
        [str(BIN_DIR / "kubectl-dra"), "explain", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert usage.startswith("usage: kubectl dra explain ")
    out = subprocess.run(
        [str(BIN_DIR / "kubectl_complete-dra"), "sim"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out == "simulate\n:4\n"


def test_kubectl_plugin_completion_leaves_the_environment_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("_ARGCOMPLETE", raising=False)
    monkeypatch.setenv("COMP_LINE", "kept")
    controller_cli.kubectl_complete([""])
    assert "_ARGCOMPLETE" not in os.environ and os.environ["COMP_LINE"] == "kept"


def _build_info(registry: CollectorRegistry, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for family in registry.collect() for s in family.samples if s.name == name]


def test_both_programs_export_their_build_as_a_gauge_of_one() -> None:
    expected = {"version": metadata.version("draplugin"), "python_version": platform.python_version()}
    plugin, controller = CollectorRegistry(), CollectorRegistry()
    ClaimMetrics(plugin)
    ControllerMetrics(controller)
    assert _build_info(plugin, "draplugin_build_info") == [(expected, 1.0)]
    assert _build_info(controller, "dra_controller_build_info") == [(expected, 1.0)]


@pytest.mark.usefixtures("restore_root_logger")
def test_the_start_log_line_names_the_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version = metadata.version("draplugin")
    # Each stops right after its start line: the plugin with a driver factory that cannot load,
    # the controller without a kubeconfig.
    monkeypatch.setenv(plugin_cli.DRIVER_FACTORY_ENV, "tests.no_such_module:factory")
    assert plugin_cli.main(["run", "--node-name", "node-1", "--metrics-port", "0"]) == 1
    assert f"msg=starting version={version} " in capsys.readouterr().err
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    assert controller_cli.main(["run", "--metrics-port", "0"]) == 1
    assert f"msg=starting version={version} " in capsys.readouterr().err


# The flags of `draplugin devices` that `run` has no use for: previews of one node's slices.
DEVICES_ONLY_FLAGS = {"--help", "--output", "--expect-taints", "--sysfs-root", "--fake-dev-root"}


def test_devices_spells_its_flags_as_run_does() -> None:
    parsers = plugin_cli.COMMAND_LINE._build(None)[1]
    run_flags = {s for a in parsers["run"]._actions for s in a.option_strings}
    # Each flag's first long spelling is its name in --help; older spellings may follow it.
    devices = {next(s for s in a.option_strings if s.startswith("--")) for a in parsers["devices"]._actions}
    assert devices - DEVICES_ONLY_FLAGS <= run_flags, sorted(devices - DEVICES_ONLY_FLAGS - run_flags)


@pytest.mark.parametrize(
    ("program", "words", "expected"),
    [
        ("dra-controller", ["dra-controller", "explain", "--all"], ["--all-namespaces "]),
        ("draplugin", ["draplugin", "devices", "--partitionable-m"], ["--partitionable-mig "]),
    ],
)
def test_the_documented_bash_line_completes(program: str, words: list[str], expected: list[str]) -> None:
    # docs/cli.md's line, evaluated in a real bash; then what bash does on TAB: set the COMP_*
    # variables and call the function the line registered for the program.
    line = " ".join(words)
    script = (
        f'eval "$(register-python-argcomplete {program})"\n'
        f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; COMP_LINE='{line}'; COMP_POINT={len(line)}\n"
        f"_python_argcomplete {program}\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == expected, done.stderr


def test_the_controller_daemon_takes_n_for_its_namespace() -> None:
    parsers = controller_cli.COMMAND_LINE._build(None)[1]
    assert parsers["run"].parse_args(["-n", "team-a"]).namespace == "team-a"
