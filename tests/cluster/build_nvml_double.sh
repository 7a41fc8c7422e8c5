#!/usr/bin/env bash
# Build the NVML test double (tests/cluster/nvmldouble): libnvidia-ml.so.1, a Go c-shared library
# with NVML's C ABI over NVIDIA's go-nvml mock machines, and gonvmlcheck, a go-nvml program that
# loads it as nvidia-ctk does. Idempotent: cached outside the repo under a stamp of every input
# and the Go version; rebuilt only when one changes. Prints the directory on its last line.
set -euo pipefail
cd "$(dirname "$0")/nvmldouble"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=1 GOFLAGS="-mod=readonly -modcacherw"

started=$(date +%s)
step() { echo "build_nvml_double: [$(( $(date +%s) - started ))s] $*" >&2; }

if ! command -v go >/dev/null 2>&1; then
  echo "build_nvml_double: no Go toolchain on PATH: install Go (1.22 or newer) to build the NVML double" >&2
  exit 1
fi
if ! command -v gcc >/dev/null 2>&1 && ! command -v cc >/dev/null 2>&1; then
  echo "build_nvml_double: no C compiler (gcc/cc): cgo needs one to build the NVML double" >&2
  exit 1
fi
go_version=$(go env GOVERSION)
stamp=$( (cat ../build_nvml_double.sh go.mod go.sum ./*.go ./*.c cmd/*/*.go; echo "$go_version") | sha256sum | cut -c1-16)
out=${DRA_NVML_DOUBLE_DIR:-$HOME/.cache/draplugin-kube/nvml-double-$stamp}

if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ] && [ -f "$out/libnvidia-ml.so.1" ]; then
  echo "build_nvml_double: up to date" >&2
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"

step "downloading go-nvml"
if ! go mod download github.com/NVIDIA/go-nvml github.com/google/uuid; then
  echo "build_nvml_double: module download failed (github.com/NVIDIA/go-nvml, pinned in tests/cluster/nvmldouble/go.mod): no module proxy or cache reachable" >&2
  exit 1
fi
nv=$(go list -m -f '{{.Dir}}' github.com/NVIDIA/go-nvml)
if [ ! -f "$nv/pkg/nvml/nvml.h" ]; then
  echo "build_nvml_double: $nv/pkg/nvml/nvml.h is missing: the go-nvml module in the cache is incomplete" >&2
  exit 1
fi
# The exports are compiled against go-nvml's own copy of NVIDIA's nvml.h.
export CGO_CFLAGS="-I$nv/pkg/nvml -O2 -Wno-deprecated-declarations"
step "compiling libnvidia-ml.so.1 (c-shared; cold: about a minute on 2 cores)"
go build -trimpath -buildmode=c-shared -ldflags '-s -w -extldflags -Wl,-soname,libnvidia-ml.so.1' \
  -o "$out/libnvidia-ml.so.1" .
rm -f "$out/libnvidia-ml.so.h"
# Every NVML symbol go-nvml references must be defined inside (see genstubs.sh), else dlopen fails.
if undefined=$(nm -D --undefined-only "$out/libnvidia-ml.so.1" | grep -w 'nvml[A-Za-z0-9_]*'); then
  echo "build_nvml_double: libnvidia-ml.so.1 leaves NVML symbols undefined; run tests/cluster/nvmldouble/genstubs.sh:" >&2
  echo "$undefined" >&2
  exit 1
fi
step "compiling gonvmlcheck"
go build -trimpath -ldflags '-s -w' -o "$out/gonvmlcheck" ./cmd/gonvmlcheck
echo "$stamp" > "$out/.stamp"
step "done: $(ls "$out" | tr '\n' ' ')"
echo "$out"
