"""Every shell command the docs show is either run here or listed with the reason it cannot be.

Commands come from fenced `sh`/`shell`/`bash`/`console` blocks of README.md,
docs/*.md and examples/**/README.md. A command that appears in no list fails
the test, so a new one cannot slip in unchecked; a listed command that no
longer appears fails too, so the lists stay true.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from draplugin.config import RUN_OPTIONS

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = (
    REPO_ROOT / "README.md",
    *sorted((REPO_ROOT / "docs").glob("*.md")),
    *sorted((REPO_ROOT / "examples").glob("**/README.md")),
)
SHELL_LANGUAGES = {"sh", "shell", "bash", "console"}
BIN_DIR = Path(sys.executable).parent

# Commands run by test_runnable_command_succeeds: our CLIs on files in the repository.
RUN_HERE: frozenset[str] = frozenset({
    "draplugin devices --backend fake --fake-config examples/fake-gpus.yaml --node-name gpu-node-1",
    "draplugin cdi-spec --backend fake --fake-config examples/fake-gpus.yaml --node-name gpu-node-1"
    " --device gpu-0",
    "dra-controller cel 'device.attributes[\"gpu.draplugin.dev\"].productName == \"NVIDIA A100-SXM4-40GB\"'"
    " -f examples/resourceslices/fake-node.yaml",
    "dra-controller cel 'device.capacity[\"gpu.draplugin.dev\"].memory.compareTo(quantity(\"64Gi\")) >= 0'"
    " -f examples/resourceslices/fake-node.yaml",
    "dra-controller lint --objects examples/deviceclasses.yaml examples/resourceslices/"
    " examples/04-select-by-model-and-memory/",
    "dra-controller lint --objects examples/deviceclasses.yaml examples/",
    # docs/deviceclasses.md shows a warning each (exit 0); tests/unit/test_lint_examples.py
    # checks that each gives exactly the finding the page shows.
    "dra-controller lint --objects examples/deviceclasses.yaml examples/resourceslices/"
    " docs/lint/untolerated-taint.yaml",
    "dra-controller lint --objects examples/deviceclasses.yaml examples/resourceslices/"
    " examples/07-all-gpus-on-node/ docs/lint/incomplete-pool.yaml",
    "dra-controller lint --objects examples/deviceclasses.yaml examples/resourceslices/"
    " docs/lint/pod-nodes.yaml",
    "dra-controller explain --namespace default team-gpu --objects examples/deviceclasses.yaml"
    " examples/resourceslices/ examples/03-preallocated-shared-claim/",
    "dra-controller explain --namespace default pod/gpu-pair --objects examples/deviceclasses.yaml"
    " examples/resourceslices/ examples/05-same-pcie-root/",
    "dra-controller simulate --objects examples/deviceclasses.yaml examples/resourceslices/"
    " examples/01-single-gpu/ examples/05-same-pcie-root/",
    # docs/migration.md
    "dra-controller migrate -f examples/device-plugin/",
    "dra-controller migrate -f examples/device-plugin/job.yaml --diff",
    "dra-controller migrate -f examples/device-plugin/deployment.yaml -o json",
    "dra-controller simulate --objects examples/device-plugin/extended-resource/ examples/resourceslices/",
    "dra-controller explain pod/four-gpus --objects examples/device-plugin/extended-resource/"
    " examples/resourceslices/",
    "dra-controller lint --objects examples/deviceclasses.yaml examples/resourceslices/fake-node.yaml"
    " docs/migration/tainted-node.yaml",
    # docs/usage.md (tests/unit/test_top_docs.py checks that the page shows what the first prints)
    "dra-controller top --metrics-file docs/usage/gpu-node-1.prom",
    "dra-controller top --metrics-file docs/usage/gpu-node-1.prom --idle",
    "dra-controller top --metrics-file docs/usage/gpu-node-1.prom --namespace team-b -o json",
    # docs/cli.md
    "dra-controller --version",
    "draplugin --version",
    "dra-controller simulate -f examples/deviceclasses.yaml -f examples/resourceslices/"
    " -f examples/01-single-gpu/",
    "dra-controller explain claim/team-gpu -f examples/deviceclasses.yaml -f examples/resourceslices/"
    " -f examples/03-preallocated-shared-claim/",
    "dra-controller lint -R -f examples/",
    "dra-controller top --metrics-file docs/usage/gpu-node-1.prom -o wide",
})  # fmt: skip

# Pages whose every command (kubectl against a cluster included) runs in order on a local cluster
# with a real kubelet, in the test named: commands shown only there need no NOT_RUN entry.
RUN_ON_LOCAL_CLUSTER: dict[str, str] = {
    "docs/migration.md": "tests/e2e/test_migration_doc.py",
}

# RUN_HERE commands the docs show failing on purpose, with the exit status they must give.
EXPECTED_EXIT: dict[str, int] = {
    # docs/troubleshooting.md: example 01 takes gpu-0, so example 05's pair cannot be allocated.
    "dra-controller simulate --objects examples/deviceclasses.yaml examples/resourceslices/"
    " examples/01-single-gpu/ examples/05-same-pcie-root/": 1,
    # docs/migration.md: the fake node has three whole GPUs; four-gpus asks for four.
    "dra-controller simulate --objects examples/device-plugin/extended-resource/ examples/resourceslices/": 1,
    "dra-controller explain pod/four-gpus --objects examples/device-plugin/extended-resource/"
    " examples/resourceslices/": 1,
}

_DRAIN_RUNBOOK = (
    "needs a cluster of several nodes; tests/e2e/test_multinode.py runs it on three local kubelet nodes"
)
_KUBECTL_EXAMPLES = (
    "kubectl against a real cluster (there is no kubectl here); tests/e2e/test_examples.py applies the "
    "same manifests on a local cluster with a real kubelet and checks the stated outcome"
)
_KUBECTL_EXTENDED = (
    "kubectl against a real cluster (there is no kubectl here); tests/e2e/test_extended_resource.py applies "
    "the same manifests on a local cluster with a real kubelet and checks the stated outcome"
)
_KUBECTL_INSPECT = "kubectl reading a real cluster's objects (there is no kubectl or user cluster here)"
_HELM_INSTALL = (
    "installs into a real cluster; tests/integration/test_chart.py renders the same chart (and values file) "
    "and has the real API server admit every object"
)
_PSA_LABEL = (
    "changes a real cluster's namespace; tests/integration/test_chart_install.py shows on the real API "
    "server that a namespace enforcing baseline refuses the plugin's pods and this label admits them"
)
_REGISTRY = "pushes to or pulls from a real registry (there is none here)"
_PIPX = "installs the wheel on an admin's machine; `make release` builds it (entry points: pyproject.toml)"
_CLUSTER_CLAIM = "needs a live cluster holding that claim; the --objects form of the command is run here"
_MAKE = "the project's own set-up and test entry points (run by CI, not from inside the test suite)"
_KUBECTL_PLUGIN = (
    "kubectl dra against a user's cluster; tests/integration/test_kubectl_plugin.py runs kubectl dra (and "
    "its completion) with the kubectl the test set-up builds"
)
_COMPLETION = (
    "changes the interactive shell; tests/unit/test_cli_habits.py evaluates the same line in bash and "
    "completes partial words through it"
)
_TOP_CLUSTER = (
    "reads the plugin pods of a live cluster; tests/integration/test_top_cluster.py runs it against the real "
    "API server's pod proxy, tests/e2e/test_top_plugin.py against a real plugin's /metrics"
)

NOT_RUN: dict[str, str] = {
    # README.md
    "make demo": "stays up until Ctrl-C; tests/e2e/test_demo.py runs the same demo with --once",
    "make test": _MAKE,
    "make venv": _MAKE,
    "make unit": _MAKE,
    "make lint": _MAKE,
    "make cluster": "starts a local cluster that runs until Ctrl-C",
    "make clean-clusters": "removes every stopped local cluster run of this machine, logs included; "
    "tests/integration/test_faults_cleanup.py runs the same prune on a directory of its own",
    "make bench": "benchmarks are kept out of the test suite by design",
    "make lock": "re-resolves every package against PyPI on purpose; test_dependency_lock.py checks the lock "
    "it writes (against pyproject.toml, its exports and the venv) and that a stale one is refused",
    # docs/scale.md
    "make scale": "a 25-minute measurement (two control planes, 5,000-node fixtures); kept out of the test "
    "suite by design like make bench; tests/unit/test_bench_scale_*.py test its pure parts",
    'make scale SCALE_ARGS="--parts offline"': "a one-minute measurement at 1,000 nodes, kept out of the "
    "test suite by design; tests/unit/test_bench_scale_*.py test its pure parts",
    'make scale SCALE_ARGS="--parts offline,live --idle-window 60"': (
        "a ten-minute measurement on two control planes of its own, kept out of the test suite by design; "
        "tests/unit/test_bench_scale_*.py test its pure parts"
    ),
    "make test-compat": "the integration and e2e suites on a second Kubernetes build (1.34); run by .ci/run",
    "make differential": "4,000 scenarios on two Kubernetes builds (~15 min); `make test` plays 300 of them",
    "K8S_VERSION=v1.34.4 tests/cluster/regen.sh": "re-pins the Go build and downloads modules (network)",
    'draplugin run --node-name "$(hostname)" --backend fake --fake-config examples/fake-gpus.yaml': (
        "a daemon that needs a kubelet and an API server; tests/e2e/test_examples.py runs it with this "
        "inventory against a real kubelet, tests/e2e/test_node_registration.py with the other flags"
    ),
    # docs/quickstart.md
    "helm upgrade --install draplugin deploy/helm/draplugin"
    " --namespace draplugin-system --create-namespace": _HELM_INSTALL,
    "helm upgrade --install draplugin deploy/helm/draplugin --namespace draplugin-system --create-namespace"
    " -f deploy/helm/values-fake-gpus.yaml": _HELM_INSTALL,
    "helm uninstall draplugin --namespace draplugin-system": "removes a release from a real cluster",
    # docs/operations.md's drain runbook: against a three-node cluster, in page order, by
    # tests/e2e/test_multinode.py (the DeviceTaintRule file of the cluster's release only).
    **{
        command: _DRAIN_RUNBOOK
        for command in (
            'kubectl drain "$NODE" --ignore-daemonsets --delete-emptydir-data --timeout=300s',
            "kubectl get resourceclaims --all-namespaces -o custom-columns='NAMESPACE:.metadata.namespace,"
            "NAME:.metadata.name,NODE:.status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0]"
            ".values[0]'",
            'sed "s/NODE_NAME/$NODE/g" docs/operations/maintenance-taint.yaml | kubectl apply -f -',
            'sed "s/NODE_NAME/$NODE/g" docs/operations/maintenance-taint-v1alpha3.yaml | kubectl apply -f -',
            'kubectl get resourceslices --field-selector spec.driver=gpu.draplugin.dev,spec.nodeName="$NODE"',
            'kubectl delete devicetaintrule "maintenance-$NODE"',
            'kubectl uncordon "$NODE"',
        )
    },
    # docs/operations.md, docs/troubleshooting.md
    "helm upgrade draplugin deploy/helm/draplugin --namespace draplugin-system --reset-then-reuse-values": (
        "upgrades a release in a real cluster; tests/integration/test_chart.py renders the same chart with "
        "each value and has the real API server admit every object"
    ),
    "helm upgrade draplugin deploy/helm/draplugin --namespace draplugin-system --reset-then-reuse-values"
    " --set logLevel=debug": (
        "upgrades a release in a real cluster; the chart passes logLevel to both daemons as --log-level "
        "(tests/integration/test_chart.py), tests/unit/test_log_style.py checks what the logs then hold"
    ),
    "kubectl get resourceslices --field-selector spec.driver=gpu.draplugin.dev": _KUBECTL_INSPECT,
    "kubectl apply -f examples/01-single-gpu/single-gpu.yaml": _KUBECTL_EXAMPLES,
    "kubectl get resourceclaims -o wide": _KUBECTL_INSPECT,
    "kubectl logs single-gpu": _KUBECTL_INSPECT,
    "kubectl label namespace draplugin-system --overwrite pod-security.kubernetes.io/enforce=privileged": (
        _PSA_LABEL
    ),
    # docs/configuration.md
    "kubectl label namespace draplugin --overwrite pod-security.kubernetes.io/enforce=privileged": _PSA_LABEL,
    # docs/install.md
    "make release": "builds the release artifacts into dist/; tests/e2e/test_chart_live.py installs the "
    "chart archive its `tools/release.sh chart` part packages",
    "skopeo copy oci-archive:dist/draplugin-image-$VERSION.oci.tar"
    " docker://$REGISTRY/draplugin:$VERSION": _REGISTRY,
    "helm push dist/draplugin-$VERSION.tgz oci://$REGISTRY/charts": _REGISTRY,
    "kubectl create namespace draplugin": _PSA_LABEL,
    "kubectl label namespace draplugin pod-security.kubernetes.io/enforce=privileged": _PSA_LABEL,
    "helm install draplugin oci://$REGISTRY/charts/draplugin --version $VERSION --namespace draplugin"
    " --set image.repository=$REGISTRY/draplugin": _REGISTRY,
    "helm install draplugin dist/draplugin-$VERSION.tgz --namespace draplugin"
    " --set image.repository=$REGISTRY/draplugin": (
        "installs into a real cluster; tests/e2e/test_chart_live.py installs the packaged archive on the "
        "local cluster (our image imported into its containerd, not pulled)"
    ),
    "pipx install dist/draplugin-$VERSION-py3-none-any.whl": _PIPX,
    # docs/troubleshooting.md
    "kubectl -n draplugin-system get daemonset"
    " -l app.kubernetes.io/component=kubelet-plugin": _KUBECTL_INSPECT,
    "kubectl -n draplugin-system get events --field-selector involvedObject.kind=DaemonSet": _KUBECTL_INSPECT,
    # docs/deviceclasses.md
    "kubectl get resourceslices -o yaml > slices.yaml": _KUBECTL_INSPECT,
    'dra-controller cel \'device.attributes["gpu.draplugin.dev"].type == "mig"\' -f slices.yaml': (
        "reads slices saved from a live cluster; the same command on examples/resourceslices/ is run here"
    ),
    # docs/usage.md
    "dra-controller top": _TOP_CLUSTER,
    "dra-controller top --plugin-namespace draplugin-system --node gpu-node-1": _TOP_CLUSTER,
    # docs/troubleshooting.md
    "kubectl describe pod my-pod": _KUBECTL_INSPECT,
    "kubectl get resourceclaims": _KUBECTL_INSPECT,
    "dra-controller explain --namespace my-namespace my-pod-gpu-x7k2p": _CLUSTER_CLAIM,
    "kubectl -n draplugin-system get pods -o wide"
    " -l app.kubernetes.io/component=kubelet-plugin": _KUBECTL_INSPECT,
    "kubectl -n draplugin-system logs ds/draplugin-kubelet-plugin": _KUBECTL_INSPECT,
    "kubectl get events --field-selector involvedObject.kind=ResourceClaim": _KUBECTL_INSPECT,
    "kubectl -n draplugin-system exec draplugin-kubelet-plugin-x7k2p -- draplugin cdi-spec --backend nvml"
    " --nvml-lib-path /driver-root --node-name gpu-node-1 -o yaml": (
        "runs in a plugin pod on a GPU node; tests/unit/test_cdispec_cli.py runs cdi-spec with the pod's "
        "DRIVER_ROOT/DRIVER_ROOT_MOUNT against generated driver trees"
    ),
    "draplugin cdi-spec --backend fake --node-name gpu-node-1 --driver-root /srv/driver-tree -o yaml": (
        "needs a copy of a driver tree; tests/unit/test_cdispec_cli.py and "
        "tests/integration/test_cdicheck_driverroot.py run it against trees laid out like real installs"
    ),
    # examples/*/README.md
    "kubectl delete -f examples/01-single-gpu/single-gpu.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/02-shared-claim-two-containers/shared-claim.yaml": _KUBECTL_EXAMPLES,
    "kubectl logs two-containers -c trainer": _KUBECTL_INSPECT,
    "kubectl logs two-containers -c profiler": _KUBECTL_INSPECT,
    "kubectl delete -f examples/02-shared-claim-two-containers/shared-claim.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/03-preallocated-shared-claim/shared-claim.yaml": _KUBECTL_EXAMPLES,
    "kubectl get resourceclaim team-gpu -o jsonpath='{.status.allocation.devices.results}'": _KUBECTL_INSPECT,
    "kubectl get resourceclaim team-gpu -o jsonpath='{.status.reservedFor}'": _KUBECTL_INSPECT,
    "kubectl delete -f examples/03-preallocated-shared-claim/shared-claim.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/04-select-by-model-and-memory/select.yaml": _KUBECTL_EXAMPLES,
    "kubectl delete -f examples/04-select-by-model-and-memory/select.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/05-same-pcie-root/same-pcie-root.yaml": _KUBECTL_EXAMPLES,
    "dra-controller explain --namespace default gpu-pair-gpus-abcde": _CLUSTER_CLAIM,
    "kubectl describe pod gpu-pair": _KUBECTL_INSPECT,
    "kubectl delete -f examples/05-same-pcie-root/same-pcie-root.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/06-first-available-fallback/first-available.yaml": _KUBECTL_EXAMPLES,
    "kubectl get resourceclaims -o jsonpath='{.items[*].status.allocation.devices.results[*].request}'": (
        _KUBECTL_INSPECT
    ),
    "kubectl delete -f examples/06-first-available-fallback/first-available.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/07-all-gpus-on-node/all-gpus.yaml": _KUBECTL_EXAMPLES,
    "kubectl delete -f examples/07-all-gpus-on-node/all-gpus.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/08-mig-device/mig.yaml": _KUBECTL_EXAMPLES,
    "kubectl logs mig-pod": _KUBECTL_INSPECT,
    "kubectl delete -f examples/08-mig-device/mig.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/09-time-slicing/time-slicing.yaml": _KUBECTL_EXAMPLES,
    "kubectl logs time-sliced -c worker-a": _KUBECTL_INSPECT,
    "kubectl delete -f examples/09-time-slicing/time-slicing.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/10-mps/mps.yaml": _KUBECTL_EXAMPLES,
    "kubectl logs mps -c inference-a": _KUBECTL_INSPECT,
    "kubectl delete -f examples/10-mps/mps.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/11-admin-access-monitoring/namespace.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -n gpu-monitoring -f examples/11-admin-access-monitoring/monitor.yaml": _KUBECTL_EXAMPLES,
    "kubectl -n gpu-monitoring logs gpu-monitor": _KUBECTL_INSPECT,
    "kubectl delete namespace gpu-monitoring": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/12-bad-opaque-config/bad-config.yaml": _KUBECTL_EXAMPLES,
    "kubectl describe pod bad-config": _KUBECTL_INSPECT,
    "kubectl delete -f examples/12-bad-opaque-config/bad-config.yaml": _KUBECTL_EXAMPLES,
    "kubectl apply -f examples/13-shared-gpu/shared-gpu.yaml": _KUBECTL_EXAMPLES,
    "kubectl get resourceclaims -o yaml | grep -A3 consumedCapacity": _KUBECTL_INSPECT,
    "kubectl logs small-inference": _KUBECTL_INSPECT,
    "kubectl logs large-inference": _KUBECTL_INSPECT,
    "kubectl delete -f examples/13-shared-gpu/shared-gpu.yaml": _KUBECTL_EXAMPLES,
    # examples/14-device-metadata/README.md, docs/device-metadata.md
    "kubectl apply -f examples/14-device-metadata/device-metadata.yaml": _KUBECTL_EXAMPLES,
    "kubectl logs reader-a": _KUBECTL_INSPECT,
    "kubectl logs reader-b": _KUBECTL_INSPECT,
    "kubectl logs template-reader": _KUBECTL_INSPECT,
    "kubectl delete -f examples/14-device-metadata/device-metadata.yaml": _KUBECTL_EXAMPLES,
    # examples/device-plugin/extended-resource/README.md
    "kubectl apply -f examples/device-plugin/extended-resource/": _KUBECTL_EXTENDED,
    "kubectl get pod two-gpus-a -o jsonpath='{.status.extendedResourceClaimStatus}'": _KUBECTL_INSPECT,
    "kubectl logs two-gpus-a": _KUBECTL_INSPECT,
    "kubectl delete -f examples/device-plugin/extended-resource/": _KUBECTL_EXTENDED,
    # docs/cli.md
    "kubectl dra explain pod/my-pod -n my-namespace": _KUBECTL_PLUGIN,
    "kubectl dra simulate -A": _KUBECTL_PLUGIN,
    "kubectl dra lint": _KUBECTL_PLUGIN,
    'eval "$(register-python-argcomplete dra-controller)"': _COMPLETION,
    'eval "$(register-python-argcomplete draplugin)"': _COMPLETION,
}

_FENCE = re.compile(r"^\s*```(\S*)\s*$")


def strip_comment(line: str) -> str:
    """Drop a trailing `# comment` that is outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_commands(text: str) -> Iterator[str]:
    """Commands in the shell blocks of a Markdown text (a `$ ` prompt, if used, marks commands)."""
    language: str | None = None
    block: list[str] = []
    for line in text.splitlines():
        fence = _FENCE.match(line)
        if fence:
            if language is None:
                language, block = fence.group(1), []
                continue
            if language in SHELL_LANGUAGES:
                prompted = any(b.lstrip().startswith("$ ") for b in block)
                for entry in block:
                    entry = entry.strip()
                    if prompted:
                        if not entry.startswith("$ "):
                            continue  # output
                        entry = entry[2:]
                    command = strip_comment(entry)
                    if command:
                        yield command
            language = None
            continue
        if language is not None:
            block.append(line)


def documented_commands() -> dict[str, list[str]]:
    """Each command → the files that show it."""
    found: dict[str, list[str]] = {}
    for path in DOC_FILES:
        for command in shell_commands(path.read_text(encoding="utf-8")):
            found.setdefault(command, []).append(str(path.relative_to(REPO_ROOT)))
    return found


def test_shell_block_parsing() -> None:
    text = "x\n```sh\nmake demo   # a comment\n# only a comment\necho '#not a comment'\n```\n"
    text += "```yaml\na: b\n```\n"
    text += "```console\n$ draplugin --help\nusage: draplugin\n```\n"
    assert list(shell_commands(text)) == ["make demo", "echo '#not a comment'", "draplugin --help"]


def test_every_documented_command_is_run_or_listed() -> None:
    found = documented_commands()
    assert found, "no shell commands found in the docs: the parser is broken"
    unlisted = {
        cmd: files
        for cmd, files in found.items()
        if cmd not in RUN_HERE and cmd not in NOT_RUN and not set(files) <= RUN_ON_LOCAL_CLUSTER.keys()
    }
    assert not unlisted, f"add these to RUN_HERE or NOT_RUN (with a reason): {unlisted}"
    assert not RUN_HERE & NOT_RUN.keys()
    assert EXPECTED_EXIT.keys() <= RUN_HERE
    assert all(reason.strip() for reason in NOT_RUN.values())


def test_pages_run_on_a_local_cluster_have_their_test() -> None:
    for page, test in RUN_ON_LOCAL_CLUSTER.items():
        assert (REPO_ROOT / page).is_file() and (REPO_ROOT / test).is_file(), (page, test)
        assert page in (REPO_ROOT / test).read_text(encoding="utf-8"), f"{test} does not read {page}"


def test_lists_hold_only_documented_commands() -> None:
    found = documented_commands()
    stale = sorted((RUN_HERE | NOT_RUN.keys()) - found.keys())
    assert not stale, f"no longer in the docs; remove from the lists: {stale}"


@pytest.mark.parametrize("command", sorted(RUN_HERE))
def test_runnable_command_succeeds(command: str) -> None:
    program, *args = shlex.split(command)
    executable = BIN_DIR / program
    assert executable.exists(), f"{program} is not installed in {BIN_DIR} (pip install -e .)"
    proc = subprocess.run(
        [str(executable), *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    expected = EXPECTED_EXIT.get(command, 0)
    assert proc.returncode == expected, f"{command}\nexit {proc.returncode}\n{proc.stderr}{proc.stdout}"
    assert proc.stdout.strip(), f"{command} printed nothing"


def test_configuration_reference_covers_every_plugin_flag() -> None:
    reference = (REPO_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [o.flag for o in RUN_OPTIONS if f"`{o.flag}`" not in reference or f"`{o.env}`" not in reference]
    assert not missing, f"docs/configuration.md does not document: {missing}"


def _value_paths(values: object, prefix: str = "") -> Iterator[str]:
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from _value_paths(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix


def test_configuration_reference_covers_every_chart_value() -> None:
    reference = (REPO_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    values = yaml.safe_load((REPO_ROOT / "deploy" / "helm" / "draplugin" / "values.yaml").read_text())
    # Maps the user fills in themselves (selectors, annotations) are documented as a whole.
    whole = ("nodeSelector", "resources", "updateStrategy", "fakeGpus", "annotations", "podAnnotations")
    missing = []
    for path in _value_paths(values):
        documented = path
        for name in whole:
            if f".{name}." in f".{path}.":
                documented = path[: path.index(name) + len(name)]
                break
        parent, _, leaf = documented.rpartition(".")
        # A row may document several siblings: `a.b`, `.c`, `.d`.
        as_sibling = bool(parent) and f"`{parent}." in reference and f"`.{leaf}`" in reference
        if f"`{documented}`" not in reference and not as_sibling:
            missing.append(documented)
    assert not missing, f"docs/configuration.md does not document chart values: {sorted(set(missing))}"


def test_example_readmes_name_existing_manifests() -> None:
    for readme in sorted((REPO_ROOT / "examples").glob("[0-9][0-9]-*/README.md")):
        for path in re.findall(r"examples/[\w./-]+\.yaml", readme.read_text(encoding="utf-8")):
            assert (REPO_ROOT / path).is_file(), f"{readme.relative_to(REPO_ROOT)} names missing {path}"


def test_published_slices_example_is_current() -> None:
    """examples/resourceslices/fake-node.yaml is exactly what `draplugin devices` prints for the inventory."""
    proc = subprocess.run(
        [str(BIN_DIR / "draplugin"), *shlex.split(
            "devices --backend fake --fake-config examples/fake-gpus.yaml --node-name gpu-node-1"
        )],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    committed = (REPO_ROOT / "examples" / "resourceslices" / "fake-node.yaml").read_text(encoding="utf-8")
    assert list(yaml.safe_load_all(committed)) == list(yaml.safe_load_all(proc.stdout))
