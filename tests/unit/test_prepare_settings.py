"""The prepare API deadline setting: default under the kubelet's 45 s, flag and variable, bad values."""

from __future__ import annotations

import pytest

from draplugin import config


def test_prepare_api_deadline_default_flag_and_environment() -> None:
    assert config.load({"node_name": "n"}, environ={}).prepare_api_deadline_s == 40.0
    assert (
        config.load({"node_name": "n", "prepare_api_deadline": "5s"}, environ={}).prepare_api_deadline_s == 5
    )
    from_env = config.load({"node_name": "n"}, environ={"PREPARE_API_DEADLINE": "1m"})
    assert from_env.prepare_api_deadline_s == 60.0


@pytest.mark.parametrize("raw", ["0", "-1s", "11m", "soon"])
def test_bad_prepare_api_deadlines_name_the_flag_and_variable(raw: str) -> None:
    with pytest.raises(config.ConfigError, match=r"--prepare-api-deadline \(PREPARE_API_DEADLINE\)"):
        config.load({"node_name": "n", "prepare_api_deadline": raw}, environ={})
