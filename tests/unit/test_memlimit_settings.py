"""`--nvidia-cdi-hook-path` and `--unlimited-shares`: they reach the NVML backend with shared GPUs."""

from __future__ import annotations

import pytest

from draplugin import cli, config
from draplugin.config import ConfigError
from draplugin.devices.shared import SharedGpus, UnlimitedShares


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in config.RUN_OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    monkeypatch.delenv(cli.DRIVER_FACTORY_ENV, raising=False)


def test_defaults_name_no_hook_and_skip_unlimited_shares() -> None:
    settings = config.load({"node_name": "n", "shared_gpus": "memory"}, environ={})
    assert settings.backend_options() == {
        "shared_gpus": SharedGpus.MEMORY,
        "nvidia_cdi_hook_path": None,
        "unlimited_shares": UnlimitedShares.SKIP,
    }


def test_flags_and_environment_reach_the_nvml_backend() -> None:
    namespace = cli.build_parser().parse_args(
        ["run", "--shared-gpus", "memory", "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook"]
    )
    flags = {k: v for k, v in vars(namespace).items() if k not in ("handler", "command")}
    settings = config.load({**flags, "node_name": "n"}, environ={"UNLIMITED_SHARES": "publish"})
    options = settings.backend_options()
    assert (options["nvidia_cdi_hook_path"], options["unlimited_shares"]) == (
        "/usr/bin/nvidia-cdi-hook",
        UnlimitedShares.PUBLISH,
    )


def test_the_fake_backend_gets_neither() -> None:
    settings = config.load({"node_name": "n", "backend": "fake", "shared_gpus": "memory"}, environ={})
    assert "nvidia_cdi_hook_path" not in settings.backend_options()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"unlimited_shares": "maybe"}, "unlimited-shares"),
        ({"nvidia_cdi_hook_path": "bin/nvidia-cdi-hook"}, "nvidia-cdi-hook-path"),
    ],
)
def test_bad_values_name_the_setting(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.load({"node_name": "n", **flags}, environ={})
