#!/usr/bin/env bash
# Build NVIDIA's own `nvidia-ctk` and `nvidia-cdi-hook` (the NVIDIA Container
# Toolkit, at the release nvidiactk/go.mod pins) from the Go module proxy: the
# reference the tests compare our CDI specs with (`nvidia-ctk cdi generate`).
# nvidiactk/ is a module of its own that names the two commands as tools, so the
# toolkit's dependencies never move the versions the cluster build uses.
# cgo is on: the toolkit loads NVML with dlopen through go-nvml.
# Cached like build.sh, outside the repo under a stamp of every input; prints
# the directory holding the binaries on its last line.
set -euo pipefail
cd "$(dirname "$0")/nvidiactk"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=1 GOFLAGS="-mod=readonly -modcacherw"

module=github.com/NVIDIA/nvidia-container-toolkit
version=$(go list -m -f '{{.Version}}' "$module")
stamp=$( (cat go.mod go.sum ../build_nvidia_ctk.sh; go env GOVERSION; cc --version 2>/dev/null | head -n 1) \
  | sha256sum | cut -c1-16)
out=${DRA_NVIDIA_CTK_DIR:-$HOME/.cache/draplugin-kube/nvidia-ctk-$version-$stamp}

started=$(date +%s)
step() { echo "build-nvidia-ctk: [$(( $(date +%s) - started ))s] $*" >&2; }

if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$out/nvidia-ctk" ] && [ -x "$out/nvidia-cdi-hook" ]; then
  step "nvidia-ctk $version is up to date"
  echo "$out"
  exit 0
fi
command -v cc >/dev/null || { echo "build-nvidia-ctk: no C compiler (cc): cgo needs one (apt-get install gcc)" >&2; exit 1; }
mkdir -p "$out"
rm -f "$out/.stamp"

step "downloading $module $version and its modules"
go mod download
# As the toolkit's Makefile links its commands: the version stamp, and NVML's symbols left for
# dlopen to resolve at run time. go-nvml's deprecated-function warnings are silenced.
ldflags="-s -w -X $module/internal/info.version=${version#v}"
ldflags+=" '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy'"
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"
step "compiling nvidia-ctk and nvidia-cdi-hook (cold: about 2 min on 2 cores)"
go build -trimpath -ldflags "$ldflags" -o "$out/" "$module/cmd/nvidia-ctk" "$module/cmd/nvidia-cdi-hook"
echo "$version" > "$out/VERSION"
echo "$stamp" > "$out/.stamp"
step "done: $("$out/nvidia-ctk" --version 2>&1 | head -n 1)"
echo "$out"
