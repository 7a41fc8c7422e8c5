#!/usr/bin/env bash
# Build our image from deploy/Dockerfile with buildah (Debian's package, runc
# underneath, no docker daemon) and export it as an OCI archive that the test
# node imports into containerd. No registry is reachable here, so the base
# image is made locally from Debian packages with mmdebstrap (a minimal
# bookworm with python3 3.11 and python3-venv) and passed to the same
# Dockerfile as PYTHON_IMAGE; on a normal machine `docker build` uses the
# public python image instead, unchanged.
#
# Idempotent: the base image is cached under ~/.cache/draplugin-images with a
# stamp of its inputs (suite, mirrors, packages); our image is rebuilt only when
# one of its inputs changes (the Dockerfile and its ignore file, both requirements exports,
# pyproject.toml, README.md and every file of the packages the wheel ships).
# Progress goes to stderr; the last line printed is the archive's path.
#
# Environment: DRA_IMAGE_CACHE (cache dir), DRA_DEBIAN_MIRROR (for example a
# snapshot mirror's URL, to pin the packages to a date), DRA_DEBIAN_SECURITY_MIRROR.
# By default both are the ones this machine's own apt is configured with.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

suite=bookworm
# The machine's apt sources (deb822 .sources files or one-line sources.list): the first URI
# whose path ends in /debian, and the first ending in /debian-security.
apt_uri() {
  cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' | tr ' ' '\n'
  sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' /etc/apt/sources.list 2>/dev/null
}
host_mirror() { apt_uri | grep -m1 -E "/$1/?\$" || true; }
mirror=${DRA_DEBIAN_MIRROR:-$(host_mirror debian)}
security_mirror=${DRA_DEBIAN_SECURITY_MIRROR:-$(host_mirror debian-security)}
if [ -z "$mirror" ] || [ -z "$security_mirror" ]; then
  echo "build-image: no Debian mirror in /etc/apt/sources.list{,.d}; set DRA_DEBIAN_MIRROR and DRA_DEBIAN_SECURITY_MIRROR" >&2
  exit 1
fi
# python3-venv brings ensurepip (the Dockerfile's `python3 -m venv`);
# ca-certificates for pip's HTTPS in the build stage; passwd for useradd.
base_packages=python3,python3-venv,ca-certificates,passwd
image_name=localhost/draplugin
cache=${DRA_IMAGE_CACHE:-$HOME/.cache/draplugin-images}
archive=$cache/draplugin-image.oci.tar

started=$(date +%s)
step() { echo "build-image: [$(( $(date +%s) - started ))s] $*" >&2; }

tests/cluster/install_debs.sh buildah mmdebstrap
mkdir -p "$cache"
# One build at a time per cache: two builds into one buildah store (a test and
# the demo, say) would see each other's half-written layers.
exec 9>"$cache/.build.lock"
if ! flock -n 9; then
  step "waiting for another build_image.sh using $cache"
  flock 9
fi
# A private store: nothing touches the machine's /var/lib/containers.
buildah=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver overlay)

# --- the base image: Debian bookworm with python3, made by mmdebstrap -------------------------------
base_stamp=$( (echo "$suite $mirror $security_mirror $base_packages"; sed -n '/^# --- the base/,/^# --- our image/p' "$0") \
  | sha256sum | cut -c1-12)
base_image=localhost/draplugin-base:$suite-$base_stamp
if "${buildah[@]}" inspect --type image "$base_image" >/dev/null 2>&1; then
  step "base image $base_image is cached"
else
  step "making base image $base_image with mmdebstrap ($suite, cold: about a minute)"
  rootfs_tar=$cache/base-rootfs.tar
  # Documentation, man pages and locales are dead weight in a daemon image.
  mmdebstrap --variant=minbase --include="$base_packages" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$rootfs_tar" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security_mirror $suite-security main" \
    2> >(sed 's/^/build-image: mmdebstrap: /' >&2)
  container=$("${buildah[@]}" from scratch)
  "${buildah[@]}" add "$container" "$rootfs_tar" / >/dev/null
  # The public python image has `python` on PATH; Debian only has python3, so the
  # Dockerfile calls python3, which both have. pip reads the system CA bundle
  # (Debian's own path) so that a build-time bundle mounted there is trusted.
  "${buildah[@]}" run --isolation chroot "$container" -- sh -c \
    'printf "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n" > /etc/pip.conf'
  "${buildah[@]}" config --cmd python3 --env LANG=C.UTF-8 \
    --label "org.opencontainers.image.description=Debian $suite python3 made by mmdebstrap" "$container"
  "${buildah[@]}" commit --rm "$container" "$base_image" >/dev/null
  rm -f "$rootfs_tar"
  # Debian's packages are not pinned (the mirror's current ones when the base was made): the list
  # is kept beside the cache and printed by every run, so a log says what the image was built on.
  "${buildah[@]}" run --isolation chroot "$("${buildah[@]}" from --pull-never "$base_image")" -- \
    dpkg-query -W -f '${Package}=${Version}\n' > "$cache/base-$base_stamp.packages"
  "${buildah[@]}" rm --all >/dev/null
fi
if [ -s "$cache/base-$base_stamp.packages" ]; then
  step "base image's Debian packages ($(wc -l < "$cache/base-$base_stamp.packages"), not pinned): $(tr '\n' ' ' < "$cache/base-$base_stamp.packages")"
fi

# --- our image, from deploy/Dockerfile ---------------------------------------------------------------
wheel_packages=$(python3 -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]))')
# shellcheck disable=SC2086 # the package list is space-separated on purpose
image_stamp=$( (echo "$base_image"; cat deploy/Dockerfile deploy/Dockerfile.dockerignore deploy/requirements.txt deploy/build-requirements.txt \
  pyproject.toml README.md; find $wheel_packages -type f -not -path '*/__pycache__/*' -not -name '*.pyc' \
  | LC_ALL=C sort | xargs sha256sum; sed -n '/^# --- our image/,$p' "$0") | sha256sum | cut -c1-12)
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
image=$image_name:$version-$image_stamp
if [ -f "$archive" ] && [ "$(cat "$cache/image-stamp" 2>/dev/null)" = "$image" ]; then
  step "image $image is up to date"
  echo "$archive"
  exit 0
fi
rm -f "$cache/image-stamp"
step "building $image from deploy/Dockerfile (packages: $wheel_packages)"
# The build stage fetches pinned wheels from PyPI: host network, and the host's
# CA bundle mounted read-only for that step only (this machine's egress
# proxy signs TLS with its own CA; the bundle is not copied into the image).
# chroot isolation: each RUN step in a chroot of the image, no runtime
# netns/cgroup setup needed (runc under buildah is what the OCI mode would add).
"${buildah[@]}" bud --isolation oci --network host --pull=never --layers \
  --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
  --build-arg PYTHON_IMAGE="$base_image" \
  -f deploy/Dockerfile --ignorefile deploy/Dockerfile.dockerignore \
  -t "$image" -t "$image_name:$version" "$repo" \
  2> >(sed 's/^/build-image: buildah: /' >&2) | sed 's/^/build-image: buildah: /' >&2
step "exporting $image to $archive"
rm -f "$archive.tmp"
"${buildah[@]}" push --quiet "$image" "oci-archive:$archive.tmp:$image" >&2
mv "$archive.tmp" "$archive"
echo "$image" > "$cache/image-stamp"
# Old builds of our image are dead weight in the private store.
"${buildah[@]}" images --noheading --format '{{.Name}}:{{.Tag}}' | grep "^$image_name:" \
  | grep -v -x -e "$image" -e "$image_name:$version" | xargs -r "${buildah[@]}" rmi >/dev/null 2>&1 || true
step "done: $image, $(du -h "$archive" | cut -f1) archive"
echo "$archive"
