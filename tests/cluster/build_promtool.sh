#!/usr/bin/env bash
# Build promtool, which checks the DCGM-compatible recording rules
# (deploy/monitoring/, the chart's PrometheusRule) and evaluates them on a
# scrape of our exporter (tests/integration/test_dcgm_rules.py), from its own
# Go module in promtool/ (github.com/prometheus/prometheus/cmd/promtool at the
# version go.mod pins). One build serves every Kubernetes release:
# ~/.cache/draplugin-kube/promtool-<version> ($DRA_PROMTOOL_BIN_DIR overrides).
# Idempotent: rebuilt only when an input changes (stamp in <dir>/.stamp).
# Progress goes to stderr; the last line printed is the directory holding promtool.
set -euo pipefail
cd "$(dirname "$0")/promtool"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -modcacherw"

version=$(go list -m -f '{{.Version}}' github.com/prometheus/prometheus)
out=${DRA_PROMTOOL_BIN_DIR:-$HOME/.cache/draplugin-kube/promtool-$version}
stamp=$( (cat go.mod go.sum ../build_promtool.sh; go env GOVERSION) | sha256sum | cut -c1-16)

if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$out/promtool" ]; then
  echo "build: promtool $version is up to date" >&2
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"
started=$(date +%s)
echo "build: compiling promtool $version without service discovery (cold: a few minutes on 2 cores)" >&2
go mod download
# remove_all_sd: no service discovery plugins (AWS, Azure, GCE, Kubernetes, ...; Prometheus's
# plugins/*.go build tags). `check rules` and `test rules` need none, and they are most of the
# compile: without them a cold build is a fraction of the full one.
go build -trimpath -tags remove_all_sd -ldflags "-s -w" -o "$out/promtool" github.com/prometheus/prometheus/cmd/promtool
echo "$version" > "$out/VERSION"
echo "$stamp" > "$out/.stamp"
echo "build: [$(( $(date +%s) - started ))s] promtool $version -> $out/promtool" >&2
echo "$out"
