#!/usr/bin/env bash
# Build the Helm CLI that the chart tests run (helm lint, helm template) into
# the same cache directory as build.sh, from its own Go module in helm/ so that
# Helm's dependencies never move the Kubernetes versions in go.mod. Idempotent:
# rebuilt only when an input changes (stamp in <dir>/.helm-stamp). Prints the
# directory on its last line, like build.sh.
#
# The directory is computed exactly as build.sh computes it: $DRA_KUBE_BIN_DIR,
# else ~/.cache/draplugin-kube/<k8s.io/kubernetes version in go.mod>.
set -euo pipefail
cd "$(dirname "$0")"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -modcacherw"

k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
out=${DRA_KUBE_BIN_DIR:-$HOME/.cache/draplugin-kube/$k8s_version}
cd helm
helm_version=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
stamp=$( (cat go.mod go.sum ../build_helm.sh; go env GOVERSION) | sha256sum | cut -c1-16)

if [ "$(cat "$out/.helm-stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$out/helm" ]; then
  echo "build: helm $helm_version is up to date" >&2
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.helm-stamp"
started=$(date +%s)
echo "build: compiling helm $helm_version (cold: a few minutes on 2 cores)" >&2
go mod download
go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  -o "$out/helm" helm.sh/helm/v4/cmd/helm
echo "$stamp" > "$out/.helm-stamp"
echo "build: [$(( $(date +%s) - started ))s] helm $helm_version -> $out/helm" >&2
echo "$out"
