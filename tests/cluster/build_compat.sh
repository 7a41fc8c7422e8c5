#!/usr/bin/env bash
# Build the test binaries for another Kubernetes release without touching the
# committed pin: copy this module to a scratch directory, re-pin it there with
# regen.sh and build it with build.sh into ~/.cache/draplugin-kube/<release>.
# Usage: K8S_VERSION=v1.34.4 tests/cluster/build_compat.sh
# Prints the directory holding the binaries on its last line; run the tests
# against it with DRA_KUBE_BIN_DIR="$(K8S_VERSION=... tests/cluster/build_compat.sh)".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_version=${K8S_VERSION:?set K8S_VERSION, e.g. v1.34.4}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

echo "compat: re-pinning a copy of tests/cluster to $k8s_version in $scratch" >&2
cp -r "$here/regen.sh" "$here/build.sh" "$here/cmd" "$here/cdicheck" "$scratch/"
(cd "$scratch" && K8S_VERSION="$k8s_version" ./regen.sh >&2)
export DRA_KUBE_BIN_DIR=${DRA_KUBE_BIN_DIR:-$HOME/.cache/draplugin-kube/$k8s_version}
"$scratch/build.sh"
