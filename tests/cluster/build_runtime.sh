#!/usr/bin/env bash
# Build the container runtime the test kubelet runs pods on: containerd v2
# (daemon, runc shim, ctr) and crictl, cgo-free, from their own Go module in
# runtime/ (versions pinned in its go.mod and go.sum). runc itself comes from
# Debian (tests/cluster/install_debs.sh). Idempotent: the binaries are cached
# under ~/.cache/draplugin-kube/runtime-<containerd version> (shared by every
# Kubernetes release, since containerd does not depend on it) with a stamp of
# every input, and rebuilt only when an input changes. Progress goes to
# stderr; the last line printed is the directory holding the binaries.
set -euo pipefail
cd "$(dirname "$0")/runtime"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -modcacherw"

containerd_version=$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
crictl_version=$(go list -m -f '{{.Version}}' sigs.k8s.io/cri-tools)
out=${DRA_RUNTIME_BIN_DIR:-$HOME/.cache/draplugin-kube/runtime-$containerd_version}
stamp=$( (cat go.mod go.sum ../build_runtime.sh; go env GOVERSION) | sha256sum | cut -c1-16)

if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build: containerd $containerd_version and crictl $crictl_version are up to date" >&2
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"
started=$(date +%s)
step() { echo "build: [$(( $(date +%s) - started ))s] $*" >&2; }

step "downloading modules for containerd $containerd_version and crictl $crictl_version"
go mod download
# The CRI plugin reports this string as the runtime version, and the Node
# shows it as containerd://<version>; unstamped it would read "+unknown".
version_flags="-X github.com/containerd/containerd/v2/version.Version=${containerd_version#v} \
 -X github.com/containerd/containerd/v2/version.Revision=release"
step "compiling containerd, containerd-shim-runc-v2, ctr (cold: about 5 min on 2 cores)"
go build -trimpath -ldflags "-s -w $version_flags" -o "$out/" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
step "compiling crictl"
go build -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" \
  -o "$out/crictl" sigs.k8s.io/cri-tools/cmd/crictl
echo "$containerd_version" > "$out/VERSION"
echo "$stamp" > "$out/.stamp"
step "done: $(ls "$out" | tr '\n' ' ')"
echo "$out"
