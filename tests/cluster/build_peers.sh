#!/usr/bin/env bash
# Build the peers the benchmarks compare against (bench/), every one from a
# pinned Go module, never a downloaded binary: our harnesses around upstream's
# DRA libraries (peers/, k8s.io/dynamic-resource-allocation and friends at one
# release: celpeer, allocpeer, slicepeer) plus any binary listed in `extra`.
# Idempotent: binaries are cached outside the repo under a stamp of every input
# (~/.cache/draplugin-kube/peers-<stamp>), rebuilt only when an input changes.
# Prints the directory holding the binaries on its last line.
set -euo pipefail
cd "$(dirname "$0")"
export GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=readonly -modcacherw"

# Every main under peers/cmd/<name> is the binary <name>.
mains=$(cd peers/cmd && ls -d */ | tr -d / | tr '\n' ' ')
# More peers, each from its own module (its own go.mod pins it): "<module dir> <package> <binary>".
# To add one: a line here; its module's go.mod/go.sum join the stamp below.
extra=(
  # bench/prepare's peer: the dra-example-driver kubelet plugin at its released pin (exampledriver/go.mod).
  "exampledriver sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin dra-example-kubeletplugin"
)

inputs() {
  cat build_peers.sh peers/go.mod peers/go.sum
  (cd peers && find . -name '*.go' | sort | xargs cat)
  for entry in "${extra[@]}"; do
    read -r dir _ _ <<<"$entry"
    cat "$dir/go.mod" "$dir/go.sum"
    echo "$entry"
  done
  go env GOVERSION
}
stamp=$(inputs | sha256sum | cut -c1-16)
out=${DRA_PEERS_BIN_DIR:-$HOME/.cache/draplugin-kube/peers-$stamp}

if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "build_peers: peers are up to date" >&2
  echo "$out"
  exit 0
fi
mkdir -p "$out"
rm -f "$out/.stamp"

started=$(date +%s)
step() { echo "build_peers: [$(( $(date +%s) - started ))s] $*" >&2; }

step "downloading modules for peers/"
(cd peers && go mod download)
# One `go build` for every main shares the compiled packages (client-go, cel-go).
step "compiling $mains(cold: a few minutes on 2 cores)"
(cd peers && go build -trimpath -ldflags "-s -w" -o "$out/" $(for m in $mains; do echo "./cmd/$m"; done))
for entry in "${extra[@]}"; do
  read -r dir package binary <<<"$entry"
  step "compiling $binary from $dir ($package)"
  (cd "$dir" && go mod download && go build -trimpath -ldflags "-s -w" -o "$out/$binary" "$package")
done
echo "$stamp" > "$out/.stamp"
step "done: $(ls "$out" | tr '\n' ' ')"
echo "$out"
