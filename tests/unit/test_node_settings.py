"""`draplugin run` settings of the node daemon: slice cleanup switch, fake and NVML backend options."""

from __future__ import annotations

from pathlib import Path

import pytest

from draplugin import cli, config
from draplugin.config import ConfigError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in config.RUN_OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    monkeypatch.delenv(cli.DRIVER_FACTORY_ENV, raising=False)


def parse(*args: str) -> dict[str, str | None]:
    namespace = cli.build_parser().parse_args(["run", *args])
    return {k: v for k, v in vars(namespace).items() if k not in ("handler", "command")}


def test_defaults_keep_slices_and_inject_faults_from_the_state_dir() -> None:
    settings = config.load({"node_name": "n", "backend": "fake"}, environ={})
    assert settings.delete_slices_on_shutdown is False
    assert settings.backend_options() == {"device_dir": "/var/lib/draplugin/fake-dev"}
    assert settings.fault_file == Path("/var/lib/draplugin/fake-faults.yaml")
    nvml = config.load({"node_name": "n"}, environ={})
    assert nvml.fault_file is None and nvml.backend_options() == {}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--delete-slices-on-shutdown"], True),
        (["--delete-slices-on-shutdown=false"], False),
        (["--delete-slices-on-shutdown", "yes"], True),
        ([], False),
    ],
)
def test_delete_slices_switch(args: list[str], expected: bool) -> None:
    settings = config.load(parse("--node-name", "n", *args), environ={})
    assert settings.delete_slices_on_shutdown is expected


def test_delete_slices_from_the_environment_and_flag_wins() -> None:
    environ = {"DELETE_SLICES_ON_SHUTDOWN": "true"}
    assert config.load({"node_name": "n"}, environ).delete_slices_on_shutdown is True
    flags = parse("--node-name", "n", "--delete-slices-on-shutdown=off")
    assert config.load(flags, environ).delete_slices_on_shutdown is False


def test_fake_options_reach_the_backend(tmp_path: Path) -> None:
    settings = config.load(
        parse("--node-name", "n", "--backend", "fake", "--fake-gpus", "4", "--fake-model", "L4"), environ={}
    )
    assert settings.backend_options() == {
        "gpus": 4,
        "model": "L4",
        "device_dir": "/var/lib/draplugin/fake-dev",
    }
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text("gpus: []\n")
    from_chart = config.load(
        {"node_name": "n", "backend": "fake"},
        {"DRAPLUGIN_FAKE_CONFIG": str(inventory), "DRAPLUGIN_FAKE_FAULT_FILE": str(tmp_path / "f.yaml")},
    )
    assert from_chart.backend_options() == {
        "config_file": str(inventory),
        "device_dir": "/var/lib/draplugin/fake-dev",
    }
    assert from_chart.fault_file == tmp_path / "f.yaml"


def test_fake_device_dir_reaches_the_backend_and_must_be_absolute() -> None:
    flags = parse("--node-name", "n", "--backend", "fake", "--fake-device-dir", "/run/fake-dev")
    assert config.load(flags, environ={}).backend_options() == {"device_dir": "/run/fake-dev"}
    with pytest.raises(config.ConfigError, match=r"--fake-device-dir .*'fake-dev' must be an absolute path"):
        config.load({"node_name": "n", "backend": "fake"}, {"DRAPLUGIN_FAKE_DEVICE_DIR": "fake-dev"})
    with pytest.raises(config.ConfigError, match="only applies to --backend fake"):
        config.load({"node_name": "n"}, {"DRAPLUGIN_FAKE_DEVICE_DIR": "/run/fake-dev"})


def test_nvml_library_path_reaches_the_backend() -> None:
    settings = config.load(parse("--node-name", "n", "--nvml-lib-path", "/run/nvidia/driver"), environ={})
    assert settings.backend_options() == {"lib_path": "/run/nvidia/driver"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"fake_gpus": "4"}, "--fake-gpus (DRAPLUGIN_FAKE_GPUS) only applies to --backend fake"),
        ({"backend": "fake", "nvml_lib_path": "/x"}, "--nvml-lib-path (NVML_LIB_PATH) only applies to"),
        ({"backend": "fake", "fake_gpus": "four"}, "(DRAPLUGIN_FAKE_GPUS): 'four' is not a whole"),
        ({"backend": "fake", "fake_gpus": "0"}, "--fake-gpus (DRAPLUGIN_FAKE_GPUS): 0 is outside 1-1024"),
        ({"backend": "fake", "fake_config": "/nonexistent.yaml"}, "/nonexistent.yaml is not a readable file"),
        ({"backend": "fake", "fake_fault_file": "faults.yaml"}, "'faults.yaml' must be an absolute path"),
        ({"delete_slices_on_shutdown": "maybe"}, "DELETE_SLICES_ON_SHUTDOWN): 'maybe' is not a boolean"),
    ],
)
def test_bad_node_options_name_the_setting(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load({"node_name": "n", **flags}, environ={})
    assert message in str(caught.value)


def test_fake_config_excludes_gpu_count(tmp_path: Path) -> None:
    inventory = tmp_path / "gpus.yaml"
    inventory.write_text("gpus: []\n")
    with pytest.raises(ConfigError, match="exclude each other"):
        config.load(
            {"node_name": "n", "backend": "fake", "fake_config": str(inventory), "fake_gpus": "2"}, environ={}
        )


def test_run_exits_1_naming_the_backend_problem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    code = cli.main(
        [
            *("run", "--node-name", "n", "--backend", "fake", "--fake-model", "no-such-gpu"),
            *("--kubeconfig", str(kubeconfig), "--metrics-port", "0", "--state-dir", str(tmp_path)),
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert 'msg="cannot build the node daemon"' in err
    assert "unknown model 'no-such-gpu'" in err


def test_rediscovery_and_health_settings_defaults_flags_and_environment() -> None:
    default = config.load({"node_name": "n"}, environ={})
    assert default.rediscover_interval_s == 60.0
    policy = default.health_policy
    assert policy.application_xids == {13, 31, 43, 45, 68, 109} and 79 in policy.fatal_xids
    assert policy.fatal_effect == "NoSchedule" and str(policy.recovery) == "on-reset"

    flags = parse(
        "--node-name=n",
        "--rediscover-interval=5m",
        "--health-application-xids=13",
        "--health-fatal-xids=79,48",
        "--health-taint-effect=NoExecute",
        "--health-recovery=after:10m",
    )
    chosen = config.load(flags, environ={})
    assert chosen.rediscover_interval_s == 300.0
    assert chosen.health_policy.application_xids == {13} and chosen.health_policy.fatal_xids == {48, 79}
    assert chosen.health_policy.fatal_effect == "NoExecute"
    assert chosen.health_policy.recovery.quiet_s == 600.0
    environ = {"REDISCOVER_INTERVAL": "0", "HEALTH_RECOVERY": "never", "HEALTH_APPLICATION_XIDS": ""}
    from_env = config.load({"node_name": "n"}, environ)
    assert from_env.rediscover_interval_s == 0 and str(from_env.health_policy.recovery) == "never"
    assert from_env.health_policy.application_xids == {13, 31, 43, 45, 68, 109}  # empty variable: unset


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--rediscover-interval=soon", r"--rediscover-interval \(REDISCOVER_INTERVAL\): 'soon'"),
        ("--rediscover-interval=-5", "REDISCOVER_INTERVAL"),
        ("--health-fatal-xids=79,x", r"HEALTH_FATAL_XIDS\): 'x' is not an XID"),
        ("--health-application-xids=13,79", "both list XID 79"),
        ("--health-taint-effect=None", "HEALTH_TAINT_EFFECT"),
        ("--health-recovery=sometimes", "HEALTH_RECOVERY"),
        ("--health-recovery=after:0s", r"HEALTH_RECOVERY\): after:<duration>"),
    ],
)
def test_bad_rediscovery_and_health_settings_name_the_flag(flag: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.load(parse("--node-name=n", flag), environ={})
