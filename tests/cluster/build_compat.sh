#!/usr/bin/env bash
# Build the test binaries for another Kubernetes release without touching the
# committed pin: copy this module to a scratch directory, re-pin it there with
# regen.sh and build it with build.sh into ~/.cache/draplugin-kube/<release>.
# Usage: K8S_VERSION=v1.34.4 tests/cluster/build_compat.sh
# Prints the directory holding the binaries on its last line; run the tests
# against it with DRA_KUBE_BIN_DIR="$(K8S_VERSION=... tests/cluster/build_compat.sh)".
# The tools that do not depend on the release (containerd, crictl, Helm) are
# shared with the default build: `make kube-tools` builds them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_version=${K8S_VERSION:?set K8S_VERSION, e.g. v1.34.4}
export DRA_KUBE_BIN_DIR=${DRA_KUBE_BIN_DIR:-$HOME/.cache/draplugin-kube/$k8s_version}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
started=$(date +%s)

cp -r "$here/regen.sh" "$here/build.sh" "$here/cmd" "$here/cdicheck" "$scratch/"
# The re-pinned go.mod and go.sum are kept beside the binaries under a stamp of
# what regen.sh's result depends on (go mod tidy reads fakecri's imports), so a
# warm run neither asks the module proxy again nor resolves anything
# differently: build.sh then finds its own stamp unchanged.
saved="$DRA_KUBE_BIN_DIR/module"
module_stamp=$( (echo "$k8s_version"; cat "$here/regen.sh" "$here/build_compat.sh" "$here"/cmd/*/*.go; go env GOVERSION) \
  | sha256sum | cut -c1-16)
if [ "$(cat "$saved/.stamp" 2>/dev/null)" = "$module_stamp" ]; then
  echo "compat: reusing the module re-pinned to $k8s_version ($saved)" >&2
  cp "$saved/go.mod" "$saved/go.sum" "$scratch/"
else
  echo "compat: re-pinning a copy of tests/cluster to $k8s_version in $scratch" >&2
  (cd "$scratch" && K8S_VERSION="$k8s_version" ./regen.sh >&2)
  mkdir -p "$saved"
  cp "$scratch/go.mod" "$scratch/go.sum" "$saved/"
  echo "$module_stamp" > "$saved/.stamp"
  echo "compat: [$(( $(date +%s) - started ))s] re-pinned" >&2
fi
"$scratch/build.sh"
