"""How the commands that read objects take them, as kubectl does: -f/--filename (repeatable) with
-R, the older --objects, -n/--namespace and -A/--all-namespaces, `pod/NAME` and `claim/NAME`; a
manifest read twice; the one JSON shape of `errors`; `top -o wide`."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
import yaml

from controller.cli import main
from controller.options import default_namespace

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
CLASSES = str(EXAMPLES / "deviceclasses.yaml")
SLICES = str(EXAMPLES / "resourceslices")
METRICS = str(REPO_ROOT / "docs" / "usage" / "gpu-node-1.prom")


def _claim(name: str, namespace: str, device_class: str = "gpu.draplugin.dev") -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}},
    }


def _write(path: Path, *objects: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(objects))
    return path


def _json_out(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def _claim_names(capsys: pytest.CaptureFixture[str]) -> list[str]:
    claims = _json_out(capsys)["claims"]
    assert isinstance(claims, list)
    return [f"{c['namespace']}/{c['name']}" for c in claims]


def test_filename_is_repeatable_and_reads_below_a_directory_only_with_recursive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path / "claims" / "top.yaml", _claim("top", "default"))
    _write(tmp_path / "claims" / "below" / "deep.yaml", _claim("deep", "default"))
    base = ["simulate", "-o", "json", "-f", CLASSES, "-f", SLICES, "-f", str(tmp_path / "claims")]
    assert main(base) == 0
    assert _claim_names(capsys) == ["default/top"]
    assert main([*base, "-R"]) == 0
    assert _claim_names(capsys) == ["default/deep", "default/top"]
    # --objects, the older flag, keeps reading directories recursively.
    assert main(["simulate", "-o", "json", "--objects", CLASSES, SLICES, str(tmp_path / "claims")]) == 0
    assert _claim_names(capsys) == ["default/deep", "default/top"]


def test_a_directory_given_twice_is_read_once_with_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    # Read twice, gpu-node-1's one slice counted twice would make its pool look incomplete.
    objects = [CLASSES, SLICES, str(EXAMPLES / "07-all-gpus-on-node")]
    assert main(["simulate", "-o", "json", "--objects", *objects]) == 0
    once = capsys.readouterr().out
    assert main(["simulate", "-o", "json", "--objects", *objects, "-f", SLICES]) == 0
    twice = capsys.readouterr()
    assert twice.out == once
    assert f"note: {SLICES}/fake-node.yaml is named more than once; read once" in twice.err


def test_one_object_in_two_files_is_an_error_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy-of-fake-node.yaml"
    shutil.copy(EXAMPLES / "resourceslices" / "fake-node.yaml", copy)
    assert main(["simulate", "-f", CLASSES, "-f", SLICES, "-f", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "ResourceSlice gpu-node-1-gpu.draplugin.dev" in err
    assert f"is defined more than once: in {SLICES}/fake-node.yaml, {copy}" in err


def test_namespace_narrows_simulate_to_that_namespaces_claims(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = _write(tmp_path / "claims.yaml", _claim("a", "team-a"), _claim("b", "team-b"))
    base = ["simulate", "-o", "json", "-f", CLASSES, "-f", SLICES, "-f", str(claims)]
    assert main([*base, "-n", "team-b"]) == 0
    assert _claim_names(capsys) == ["team-b/b"]
    for every in ([], ["-A"], ["--all-namespaces"]):
        assert main([*base, *every]) == 0
        assert _claim_names(capsys) == ["team-a/a", "team-b/b"]


def test_namespace_and_all_namespaces_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["lint", "-n", "x", "-A", "-f", CLASSES])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    "target", ["team-gpu", "claim/team-gpu", "resourceclaim/team-gpu", "ResourceClaims/team-gpu"]
)
def test_explain_takes_a_claim_by_kubectl_style_names(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = [CLASSES, SLICES, str(EXAMPLES / "03-preallocated-shared-claim")]
    assert main(["explain", target, "-o", "json", "--objects", *objects]) == 0
    assert _json_out(capsys)["claim"] == "default/team-gpu"


@pytest.mark.parametrize("target", ["pod/gpu-pair", "pods/gpu-pair", "po/gpu-pair"])
def test_explain_takes_a_pod_by_kubectl_style_names(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    objects = [CLASSES, SLICES, str(EXAMPLES / "05-same-pcie-root")]
    assert main(["explain", target, "-o", "json", "--objects", *objects]) == 0
    assert _json_out(capsys)["pod"] == "default/gpu-pair"


def test_explain_refuses_other_kinds_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["explain", "node/gpu-node-1", "-f", CLASSES])
    assert exited.value.code == 2
    assert "explain takes a ResourceClaim (NAME, claim/NAME) or a pod (pod/NAME), not 'node'" in (
        capsys.readouterr().err
    )


def test_explain_all_namespaces_finds_the_one_namespace_holding_the_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = _write(
        tmp_path / "claims.yaml", _claim("solo", "team-a"), _claim("twin", "team-a"), _claim("twin", "team-b")
    )
    base = ["-o", "json", "-f", CLASSES, "-f", SLICES, "-f", str(claims)]
    assert main(["explain", "claim/solo", "-A", *base]) == 0
    assert _json_out(capsys)["claim"] == "team-a/solo"
    assert main(["explain", "twin", "-A", *base]) == 2
    assert (
        "ResourceClaim twin found in namespaces team-a, team-b: name one with -n" in capsys.readouterr().err
    )
    assert main(["explain", "nowhere", "-A", *base]) == 2
    assert "ResourceClaim nowhere not found in any namespace" in capsys.readouterr().err


def _kubeconfig(path: Path, namespace: str | None) -> Path:
    context: dict[str, str] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": "mine", "context": context},
            {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "ops"}},
        ],
        "current-context": "mine",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _args(**given: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "namespace": None, "all_namespaces": False, "objects": [], "filename": [],
        "kubeconfig": None, "context": None,
    }  # fmt: skip
    values.update(given)
    return argparse.Namespace(**values)


def test_explain_defaults_to_the_kubeconfig_contexts_namespace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = _kubeconfig(tmp_path / "kubeconfig", "team-a")
    assert default_namespace(_args(kubeconfig=str(config))) == "team-a"
    assert default_namespace(_args(kubeconfig=str(config), context="other")) == "ops"
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert default_namespace(_args()) == "team-a"
    assert default_namespace(_args(namespace="given")) == "given"
    # Offline, as kubectl with -f: "default".
    assert default_namespace(_args(filename=[CLASSES])) == "default"
    bare = _kubeconfig(tmp_path / "bare", None)
    assert default_namespace(_args(kubeconfig=str(bare))) == "default"


def test_errors_is_a_list_of_objects_in_every_commands_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _write(tmp_path / "bad-class.yaml", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "broken"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]},
    })  # fmt: skip
    assert main(["lint", "-o", "json", "-f", str(bad), "-f", SLICES]) == 1
    lint = _json_out(capsys)
    findings = lint["findings"]
    assert isinstance(findings, list) and isinstance(lint["errors"], list) and lint["errors"]
    assert lint["errors"] == [f for f in findings if f["severity"] == "error"]
    assert main(["cel", "device.attributes['x'].y", "-f", f"{SLICES}/fake-node.yaml", "-o", "json"]) == 1
    cel = _json_out(capsys)
    assert isinstance(cel["errors"], list) and all(isinstance(e, dict) for e in cel["errors"])
    assert main(["top", "--metrics-file", str(tmp_path / "absent.prom"), "-o", "json"]) == 1
    top = _json_out(capsys)
    assert isinstance(top["errors"], list) and all(isinstance(e, dict) for e in top["errors"])


def test_top_wide_adds_the_uuid_and_source_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--metrics-file", METRICS]) == 0
    narrow = capsys.readouterr().out.splitlines()
    assert main(["top", "--metrics-file", METRICS, "-o", "wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert wide[0].split()[-2:] == ["UUID", "SOURCE"] and "UUID" not in narrow[0]
    assert len(wide) == len(narrow)
    assert all(METRICS in line for line in wide[1:])


def test_cel_reads_slices_from_directories_as_the_other_commands_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    below = tmp_path / "slices" / "below"
    below.mkdir(parents=True)
    shutil.copy(EXAMPLES / "resourceslices" / "fake-node.yaml", below / "fake-node.yaml")
    single = ["cel", "true", "-o", "json", "-f", f"{SLICES}/fake-node.yaml"]
    assert main(single) == 0
    devices = _json_out(capsys)["matches"]
    assert main(["cel", "true", "-o", "json", "-f", SLICES, "-f", f"{SLICES}/fake-node.yaml"]) == 0
    assert _json_out(capsys)["matches"] == devices  # the file named twice is read once
    assert main(["cel", "true", "-o", "json", "-f", str(tmp_path / "slices")]) == 0
    assert _json_out(capsys)["matches"] == []
    assert main(["cel", "true", "-o", "json", "-R", "-f", str(tmp_path / "slices")]) == 0
    assert _json_out(capsys)["matches"] == devices
