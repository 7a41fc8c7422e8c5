#!/usr/bin/env bash
# Build metadatacheck (metadatacheck/: upstream's device metadata reader and kubelet plugin
# helper, k8s.io/dynamic-resource-allocation at the pin in metadatacheck/go.mod) from the Go
# module proxy, never a downloaded binary. The device metadata tests check every file the plugin
# writes with it and compare ours with what upstream's helper writes for the same claim.
# Idempotent: cached outside the repo under a stamp of every input
# (~/.cache/draplugin-kube/metadatacheck-<stamp>), rebuilt only when an input changes.
# Prints the directory holding the binary on its last line.
set -euo pipefail
cd "$(dirname "$0")"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -modcacherw"

stamp=$( (cat build_metadatacheck.sh metadatacheck/go.mod metadatacheck/go.sum metadatacheck/*.go; go env GOVERSION) \
  | sha256sum | cut -c1-16)
out=${DRA_METADATACHECK_DIR:-$HOME/.cache/draplugin-kube/metadatacheck-$stamp}

if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build_metadatacheck: up to date" >&2
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"
started=$(date +%s)
echo "build_metadatacheck: compiling (cold: about a minute on 2 cores)" >&2
(cd metadatacheck && go mod download && go build -trimpath -ldflags "-s -w" -o "$out/metadatacheck" .)
echo "$stamp" > "$out/.stamp"
echo "build_metadatacheck: [$(( $(date +%s) - started ))s] done" >&2
echo "$out"
