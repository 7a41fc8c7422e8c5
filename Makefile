# Every target does its own set-up on a fresh machine: the venv with the
# package and its dev extra, and the Kubernetes binaries built from Go modules.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
KUBE_BUILD := tests/cluster/build.sh

.PHONY: venv lock kube kube-tools nvidia-tools lint unit test test-compat kube-compat differential demo cluster clean-clusters bench bench-compare scale proto clean-venv gpu-check release

# The venv is exactly uv.lock (tools/lock.py says why uv): pip installs the locked uv from
# its hash-pinned export, then uv installs every locked package, the dev extra and the lock
# group, and this package editable. --locked refuses a lock that pyproject.toml has moved
# away from (run `make lock`); a sync leaves nothing in the venv that the lock lacks.
$(VENV)/.installed: pyproject.toml uv.lock tools/uv-requirements.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --require-hashes --no-deps -r tools/uv-requirements.txt
	UV_PROJECT_ENVIRONMENT=$(VENV) UV_PYTHON_DOWNLOADS=never \
	  $(VENV)/bin/uv sync --locked --python $(PY) --extra dev --group lock
	touch $@

# Refresh uv.lock on purpose (every package to the newest version pyproject.toml allows;
# LOCK_ARGS=--upgrade-package NAME moves one) and rewrite its exports (tools/lock.py).
LOCK_ARGS ?=
lock: venv
	$(PY) -m tools.lock $(LOCK_ARGS)

venv: $(VENV)/.installed

# Cached under ~/.cache/draplugin-kube/<version>; a no-op when inputs are unchanged.
kube: kube-tools
	$(KUBE_BUILD) >/dev/null

# What the tests need that does not depend on the Kubernetes release, built
# once and shared by every release: containerd and crictl (runtime-<version>),
# Helm (helm-<version>), promtool (promtool-<version>, for the DCGM recording
# rules); runc, the CNI plugins and busybox come from Debian (installed only
# when missing); our image from deploy/Dockerfile (buildah).
kube-tools:
	tests/cluster/install_debs.sh
	tests/cluster/build_runtime.sh >/dev/null
	tests/cluster/build_helm.sh >/dev/null
	tests/cluster/build_promtool.sh >/dev/null
	tests/cluster/build_image.sh >/dev/null

# NVIDIA's software that the GPU half is tested against, without a GPU, each cached and
# rebuilt only when its inputs change: the C-ABI NVML double over go-nvml's mock machines
# (build_nvml_double.sh), Debian's non-free NVIDIA 550.163.01 packages unpacked
# (fetch_nvidia_debs.sh, never installed), nvidia-ctk v1.20.2 (build_nvidia_ctk.sh) and
# metadatacheck, upstream's device metadata reader and helper (build_metadatacheck.sh).
# The tests find each by the directory its script prints.
NVIDIA_ENV = DRA_NVML_DOUBLE_DIR="$$(tests/cluster/build_nvml_double.sh)" \
  DRA_NVIDIA_DEBS_DIR="$$(tests/cluster/fetch_nvidia_debs.sh)" \
  DRA_NVIDIA_CTK_DIR="$$(tests/cluster/build_nvidia_ctk.sh)" \
  DRA_METADATACHECK_DIR="$$(tests/cluster/build_metadatacheck.sh)"
nvidia-tools:
	tests/cluster/build_nvml_double.sh >/dev/null
	tests/cluster/fetch_nvidia_debs.sh >/dev/null
	tests/cluster/build_nvidia_ctk.sh >/dev/null
	tests/cluster/build_metadatacheck.sh >/dev/null

proto: venv
	$(PY) -m tools.protogen

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

unit: venv nvidia-tools
	$(NVIDIA_ENV) $(PY) -m pytest tests/unit

# The test command: lint, type check, then every test (unit, integration
# against the real control plane, end-to-end with a real kubelet).
test: venv kube nvidia-tools
	$(MAKE) --no-print-directory lint
	$(NVIDIA_ENV) DRA_KUBE_BIN_DIR="$$($(KUBE_BUILD))" $(PY) -m pytest

# The integration and end-to-end tests against the supported floor, a second
# Kubernetes build (~/.cache/draplugin-kube/<COMPAT_K8S_VERSION>) beside the
# shared tools; .ci/run runs it after `make test`. COMPAT_MARKERS narrows it.
COMPAT_K8S_VERSION ?= v1.34.4
COMPAT_MARKERS ?= cluster or kubelet
# The floor's build alone (.ci/run makes it beside `make test`; test-compat makes it when missing).
kube-compat:
	K8S_VERSION=$(COMPAT_K8S_VERSION) tests/cluster/build_compat.sh >/dev/null
test-compat: venv kube-tools nvidia-tools
	$(NVIDIA_ENV) DRA_KUBE_BIN_DIR="$$(K8S_VERSION=$(COMPAT_K8S_VERSION) tests/cluster/build_compat.sh)" \
	  $(PY) -m pytest tests/integration tests/e2e -m "$(COMPAT_MARKERS)"

# simulate against the real kube-scheduler on DIFFERENTIAL_SCENARIOS random scenarios per
# release (tests/differential/), 1.37 and the 1.34 compatibility build; prints each release's
# agreement rate and every disagreement, shrunk to a ready-to-commit case. `make test` plays 300.
DIFFERENTIAL_SCENARIOS ?= 2000
differential: venv kube-tools
	DIFFERENTIAL_SCENARIOS=$(DIFFERENTIAL_SCENARIOS) DRA_KUBE_BIN_DIR="$$($(KUBE_BUILD))" \
	  $(PY) -m pytest tests/integration/test_scheduler_differential.py -q -s -p no:cacheprovider; \
	  latest=$$?; \
	DIFFERENTIAL_SCENARIOS=$(DIFFERENTIAL_SCENARIOS) \
	  DRA_KUBE_BIN_DIR="$$(K8S_VERSION=$(COMPAT_K8S_VERSION) tests/cluster/build_compat.sh)" \
	  $(PY) -m pytest tests/integration/test_scheduler_differential.py -q -s -p no:cacheprovider \
	  && exit $$latest

# The main job on the embedded default: a local cluster with fake GPUs.
demo: venv kube
	DRA_KUBE_BIN_DIR="$$($(KUBE_BUILD))" $(PY) -m devcluster.demo

# A local control plane (and kubelet) for humans; stays up until Ctrl-C.
# `make cluster NODES=3`: three kubelet nodes, each with its own containerd, directories, address and
# fake GPU inventory, and one plugin pod of the chart on each (devcluster/nodeset.py).
NODES ?= 1
cluster: venv kube
	DRA_KUBE_BIN_DIR="$$($(KUBE_BUILD))" $(PY) -m devcluster.localcluster --nodes $(NODES)

# What stopped `make cluster`/`make demo` runs left in the temp directory, their kept logs
# included (each start already prunes what a killed run left, down to its logs).
clean-clusters: venv
	$(PY) -m devcluster.rundir prune --all

# The peers (tests/cluster/build_peers.sh: the dra-example-driver plugin and our Go harnesses around
# upstream's libraries) are built first, cached like the Kubernetes binaries.
bench: venv kube
	DRA_KUBE_BIN_DIR="$$($(KUBE_BUILD))" DRA_PEERS_BIN_DIR="$$(tests/cluster/build_peers.sh)" $(PY) -m bench

# Fleet-scale figures (docs/scale.md), not part of `make test`: explain and simulate at 1,000 nodes
# x 8 GPUs beside the JSON-parse floor, simulate per claim at 100, 1,000 and 5,000 nodes, and the
# real kube-scheduler's pods/s on the same objects, and `dra-controller run` and one draplugin at
# idle (each size a control plane of its own; run nothing else heavy beside it). Rows are merged
# into bench/results.json. SCALE_ARGS narrows or widens it.
SCALE_ARGS ?= --parts offline,per-claim,scheduler,live --per-claim-nodes 100,1000,5000 --scheduler-nodes 100,1000 --live-nodes 100,1000
scale: venv kube
	DRA_KUBE_BIN_DIR="$$($(KUBE_BUILD))" $(PY) -m bench.scale $(SCALE_ARGS)

# Two saved bench/results.json files side by side: make bench-compare A=old.json B=new.json
bench-compare: venv
	$(PY) -m bench.compare "$(A)" "$(B)"

# On a machine with an NVIDIA GPU and driver, never in CI: NVML discovery, the CDI specs and a
# runc container against the driver's own nvidia-smi (draplugin/gpucheck/). No set-up step:
# a GPU machine may reach no package registry; the venv is used when there is one.
gpu-check:
	PYTHONPATH="$(CURDIR)" $(if $(wildcard $(PY)),$(PY),python3) -m draplugin.gpucheck $(GPU_CHECK_ARGS)

# The release artifacts, one version (pyproject.toml's) in dist/: the chart packaged for an OCI
# registry, our image as an OCI archive, the package as a wheel for pipx (tools/release.sh;
# pushing and installing them: docs/install.md).
release: venv
	tools/release.sh

clean-venv:
	rm -rf $(VENV)
