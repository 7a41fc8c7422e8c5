#!/usr/bin/env bash
# Install the Debian packages the real container runtime needs: runc (the OCI
# runtime containerd starts containers with), containernetworking-plugins
# (bridge + host-local: pod addresses that exist only inside the pods' network
# namespaces), busybox-static (the workload image's only binary) and
# bash-completion (kubectl's bash completion script needs it, as on an admin's
# machine: tests/integration/test_kubectl_plugin.py completes `kubectl dra` with it).
# Idempotent: asks dpkg first and runs apt-get (update included) only when a
# package is missing. Needs root for the install itself, like the kubelet.
set -euo pipefail
# Callers may name more packages (build_image.sh: buildah, mmdebstrap).
packages=(runc containernetworking-plugins busybox-static bash-completion "$@")
missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
# Not pinned: Debian's stable suite gets security and point-release updates, and an old version
# leaves its mirror. Every run prints the versions it used instead (README, "What is pinned").
installed_versions() {
  echo "install_debs: using $(dpkg-query -W -f='${Package}=${Version} ' "${packages[@]}")" >&2
}
if [ ${#missing[@]} -eq 0 ]; then
  installed_versions
  exit 0
fi
echo "install_debs: installing ${missing[*]}" >&2
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
installed_versions
