#!/usr/bin/env bash
# Re-pin the Go module that builds the real Kubernetes components used by the
# tests and the demo. Usage: K8S_VERSION=v1.37.2 tests/cluster/regen.sh
#
# k8s.io/kubernetes is not meant to be consumed as a library: its go.mod maps
# every staging module (k8s.io/api, k8s.io/client-go, ...) to ./staging with a
# placeholder version, and replace directives of a dependency are ignored. We
# therefore write one replace per staging module, pointing at the published
# v0.<minor>.<patch> tag, before asking Go to resolve anything.
set -euo pipefail
cd "$(dirname "$0")"
export GOWORK=off GOTOOLCHAIN=local GOFLAGS=-modcacherw

k8s_version=${K8S_VERSION:-v1.37.2}
staging_version=v0.${k8s_version#v1.}

echo "regen: pinning k8s.io/kubernetes@${k8s_version} (staging ${staging_version})"
rm -f go.mod go.sum
go mod init draplugin.local/tests/cluster >/dev/null 2>&1

upstream_gomod=$(go mod download -json "k8s.io/kubernetes@${k8s_version}" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
echo "regen: upstream $(grep '^go ' "$upstream_gomod")"

for module in $(grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/' "$upstream_gomod" | awk '{print $1}'); do
  go mod edit -replace="${module}=${module}@${staging_version}"
done

go get "k8s.io/kubernetes@${k8s_version}"
# etcd at exactly the version Kubernetes itself pins, so client and server agree.
etcd_version=$(awk '$1=="go.etcd.io/etcd/client/v3"{print $2; exit}' "$upstream_gomod")
echo "regen: etcd ${etcd_version}"
# Every path carries its version: a bare `go get -tool PATH` means @upgrade and
# would silently move etcd (and its gRPC, otel, ...) past what Kubernetes tested.
go get -tool "go.etcd.io/etcd/server/v3@${etcd_version}" \
  "k8s.io/kubernetes/cmd/kube-apiserver@${k8s_version}" \
  "k8s.io/kubernetes/cmd/kube-controller-manager@${k8s_version}" \
  "k8s.io/kubernetes/cmd/kube-scheduler@${k8s_version}" \
  "k8s.io/kubernetes/cmd/kubectl@${k8s_version}" \
  "k8s.io/kubernetes/cmd/kubelet@${k8s_version}"

# GODEBUG defaults come from the main module's go line: mirror upstream's so
# the binaries behave like release builds.
go mod edit -go="$(awk '$1=="go"{print $2; exit}' "$upstream_gomod")"
godebug=$(awk '$1=="godebug"{print $2; exit}' "$upstream_gomod")
[ -z "$godebug" ] || go mod edit -godebug="$godebug"

go mod tidy
go list -m k8s.io/kubernetes go.etcd.io/etcd/server/v3 k8s.io/api k8s.io/cri-client
echo "regen: done"
