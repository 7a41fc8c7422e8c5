"""`dra-controller explain CLAIM` in text builds only the text (the JSON of every node is for
-o json/yaml), with the same exit status as the JSON answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import fleet
from controller.cli import main
from controller.explain.explanation import Explanation


@pytest.fixture()
def objects(tmp_path: Path) -> str:
    claims = [fleet.unfittable_claim(), *fleet.whole_gpu_claims(1, by="model")]
    fleet.write_fleet(tmp_path, nodes=4, gpus_per_node=2, claims=claims)
    return str(tmp_path)


@pytest.mark.parametrize(("claim", "status"), [("unfittable", 1), ("claim-00000", 0)])
def test_text_and_json_answers_exit_alike(
    objects: str, claim: str, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", claim, "-n", "default", "--objects", objects]) == status
    text = capsys.readouterr().out
    assert main(["explain", claim, "-n", "default", "-o", "json", "--objects", objects]) == status
    answer = json.loads(capsys.readouterr().out)
    assert text.splitlines()[0] == answer["summary"]


def test_text_output_builds_no_json(
    objects: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(self: Explanation) -> None:
        raise AssertionError("to_json for text output")

    monkeypatch.setattr(Explanation, "to_json", refuse)
    assert main(["explain", "unfittable", "-n", "default", "--objects", objects]) == 1
    assert "cannot be allocated on 4 node(s)" in capsys.readouterr().out


def test_a_request_of_a_missing_class_is_reported_on_every_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = fleet.unfittable_claim("nowhere")
    claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "missing.example.com"
    fleet.write_fleet(tmp_path, nodes=3, gpus_per_node=2, claims=[claim])
    assert main(["explain", "nowhere", "-n", "default", "-o", "json", "--objects", str(tmp_path)]) == 1
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert len(nodes) == 3
    for node in nodes:
        (request,) = node["requests"]
        assert request["deviceClassName"] == "missing.example.com"
        assert [pool["note"] for pool in request["pools"]] == ["no such class"]
        assert "device class missing.example.com does not exist" in node["verdict"]
