#!/usr/bin/env bash
# Build the Helm CLI that the chart tests run (helm lint, helm template, and
# the live install) from its own Go module in helm/, so that Helm's
# dependencies never move the Kubernetes versions in go.mod. Helm does not
# depend on the Kubernetes release under test, so one build serves every
# release: ~/.cache/draplugin-kube/helm-<helm version> ($DRA_HELM_BIN_DIR
# overrides; devcluster/binaries.py computes the same path). Idempotent:
# rebuilt only when an input changes (stamp in <dir>/.stamp). Progress goes to
# stderr; the last line printed is the directory holding helm.
set -euo pipefail
cd "$(dirname "$0")/helm"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -modcacherw"

helm_version=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
out=${DRA_HELM_BIN_DIR:-$HOME/.cache/draplugin-kube/helm-$helm_version}
stamp=$( (cat go.mod go.sum ../build_helm.sh; go env GOVERSION) | sha256sum | cut -c1-16)

if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$out/helm" ]; then
  echo "build: helm $helm_version is up to date" >&2
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"
started=$(date +%s)
echo "build: compiling helm $helm_version (cold: a few minutes on 2 cores)" >&2
go mod download
go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  -o "$out/helm" helm.sh/helm/v4/cmd/helm
echo "$helm_version" > "$out/VERSION"
echo "$stamp" > "$out/.stamp"
echo "build: [$(( $(date +%s) - started ))s] helm $helm_version -> $out/helm" >&2
echo "$out"
