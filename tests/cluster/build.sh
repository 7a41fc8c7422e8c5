#!/usr/bin/env bash
# Build the real Kubernetes components the tests and the demo run: etcd,
# kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, the
# recording fake CRI, and the CDI checker. Idempotent: binaries are cached
# outside the repo under a stamp of every input, and rebuilt only when an
# input changes. Prints the directory holding the binaries on its last line.
set -euo pipefail
cd "$(dirname "$0")"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -modcacherw"

k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
out=${DRA_KUBE_BIN_DIR:-$HOME/.cache/draplugin-kube/$k8s_version}
stamp=$( (cat go.mod go.sum build.sh cmd/*/*.go cdicheck/go.mod cdicheck/go.sum cdicheck/*.go; go env GOVERSION) | sha256sum | cut -c1-16)

if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build: binaries for $k8s_version are up to date" >&2
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"

# Release builds stamp their version; the apiserver reports it on /version and
# the kubelet compares it against the control plane's.
version_flags="-X k8s.io/component-base/version.gitVersion=$k8s_version \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$k8s_minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$k8s_minor"

started=$(date +%s)
step() { echo "build: [$(( $(date +%s) - started ))s] $*" >&2; }

step "downloading modules for $k8s_version"
go mod download
# One `go build` for all Kubernetes mains shares every compiled package.
# kubectl too: the one a user of `make cluster` runs, at the cluster's release.
step "compiling kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, fakecri (cold: about 9 min on 2 cores)"
go build -trimpath -ldflags "-s -w $version_flags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kubectl \
  ./cmd/fakecri
step "compiling etcd"
go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
# The CDI checker is its own module so the CDI library's dependencies can never
# move the versions Kubernetes was built and tested with.
step "compiling cdicheck"
(cd cdicheck && go build -trimpath -ldflags "-s -w" -o "$out/cdicheck" .)
# Tests read the release from here, so a compatibility build (another pin in
# another directory) gets that release's feature gates.
echo "$k8s_version" > "$out/VERSION"
echo "$stamp" > "$out/.stamp"
step "done: $(ls "$out" | tr '\n' ' ')"
echo "$out"
