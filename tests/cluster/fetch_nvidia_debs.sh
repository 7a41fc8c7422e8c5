#!/usr/bin/env bash
# Download NVIDIA's real user-space driver files, as Debian trixie packages them
# (non-free, pinned to 550.163.01-2), and unpack them into one tree the tests
# build driver roots from (tests/nvidia_roots.py). Nothing is installed on this
# machine: apt runs with a private configuration (its own sources list, state,
# lists and cache under the cache directory; Debian's archive keyring from
# /usr/share/keyrings) and only `apt-get download`s; apt checks each .deb's
# SHA256 against the signed index, and this script checks it again against
# `apt-cache show` and records it in packages.txt.
#
# Cached under ~/.cache/draplugin-kube/nvidia-debs-<version>/ with a stamp of
# this script (which holds the package list): a warm run re-checks the recorded
# hashes and returns at once. Progress goes to stderr; the last stdout line is
# the cache directory, which holds:
#   tree/           every package unpacked with `dpkg-deb -x` (one tree)
#   control/<pkg>/  each package's control files (`dpkg-deb -e`: postinst, md5sums ...)
#   debs/           the downloaded .deb files
#   packages.txt    "<package> <version> <component> <size> <sha256>" per package
#   VERSION         the driver version (550.163.01)
set -euo pipefail

upstream=550.163.01
debian_version=$upstream-2
suite=trixie
components="non-free non-free-firmware"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

# Compute and utility (what the Container Toolkit mounts for CUDA containers), video, the
# binaries, the GSP firmware, the alternatives that link them into the search path, and the
# GLX/EGL/Vulkan/OpenCL files of the opt-in graphics capability. All are built from the
# nvidia-graphics-drivers source at this version; nvidia-persistenced is not (it is in contrib,
# built from its own source at 550.163.01-1) and egl-wayland is in main at its own version, so
# neither is here. nvidia-vulkan-icd and nvidia-egl-icd are empty dependency packages, kept so
# the list names what a Debian user installs.
required="
  nvidia-smi libcuda1 libnvidia-ml1 libnvidia-cfg1 libnvidia-encode1 libnvcuvid1
  libnvidia-ptxjitcompiler1 libnvidia-nvvm4 libnvidia-allocator1 libcudadebugger1
  libnvidia-gpucomp nvidia-opencl-icd nvidia-opencl-common nvidia-cuda-mps nvidia-driver-bin
  nvidia-alternative nvidia-kernel-support firmware-nvidia-gsp
  libnvidia-eglcore libnvidia-glcore libnvidia-glvkspirv libegl-nvidia0 libglx-nvidia0
  libgles-nvidia1 libgles-nvidia2 nvidia-egl-common nvidia-egl-icd nvidia-vulkan-common
  nvidia-vulkan-icd libnvidia-rtcore libnvidia-fbc1 libnvidia-api1 libnvidia-ngx1
  nvidia-vdpau-driver
"
# Downloaded when the archive has them at this version.
optional="libnvidia-opticalflow1 libnvidia-pkcs11-openssl3"

out=${DRA_NVIDIA_DEBS_DIR:-$HOME/.cache/draplugin-kube/nvidia-debs-$debian_version}
stamp=$( (cat "$0"; echo "$mirror") | sha256sum | cut -c1-16)
started=$(date +%s)
step() { echo "fetch-nvidia-debs: [$(( $(date +%s) - started ))s] $*" >&2; }
fail() { echo "fetch-nvidia-debs: $*" >&2; exit 1; }

if [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ] && [ -d "$out/tree/usr" ]; then
  # Warm: the recorded hashes still match the files (a cheap guard against a damaged cache).
  if (cd "$out/debs" && awk '{print $5 "  " $1 "_" $2 "_amd64.deb"}' ../packages.txt \
        | sed 's/_[0-9]*:/_/' | sha256sum --quiet -c - >&2); then
    step "NVIDIA $debian_version packages are cached and their sha256 match ($(wc -l < "$out/packages.txt") packages)"
    echo "$out"
    exit 0
  fi
  step "the cached .deb files do not match packages.txt: fetching again"
fi

for tool in apt-get apt-cache dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null || fail "$tool not found: this needs a Debian-family machine's apt and dpkg-deb"
done
[ -r "$keyring" ] || fail "$keyring missing: install the debian-archive-keyring package"

rm -rf "$out.new"
mkdir -p "$out.new"/{apt/lists/partial,apt/cache/archives/partial,apt/etc,debs,tree,control}
apt_dir=$out.new/apt
echo "deb [signed-by=$keyring] $mirror $suite $components" > "$apt_dir/etc/sources.list"
: > "$apt_dir/status"
apt_opts=(
  -o "Dir::Etc::sourcelist=$apt_dir/etc/sources.list" -o Dir::Etc::sourceparts=-
  -o "Dir::Etc::preferences=$apt_dir/etc/preferences" -o Dir::Etc::preferencesparts=-
  -o "Dir::State=$apt_dir" -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::State::status=$apt_dir/status"
  -o "Dir::Cache=$apt_dir/cache" -o APT::Architecture=amd64 -o APT::Architectures=amd64
  -o Acquire::Languages=none -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
  -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
  -o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false
  -o Acquire::IndexTargets::deb::CNF::DefaultEnabled=false -o Debug::NoLocking=1
)
# As root, apt drops to the _apt user to download, who cannot write under $HOME.
[ "$(id -u)" = 0 ] && apt_opts+=(-o APT::Sandbox::User=root)

step "reading the $suite $components indexes from $mirror"
if ! apt-get "${apt_opts[@]}" -q update >"$apt_dir/update.log" 2>&1 \
    || grep -qE '^(W|E): .*(Failed|not signed|NO_PUBKEY)' "$apt_dir/update.log"; then
  cat "$apt_dir/update.log" >&2
  fail "cannot read Debian's $suite indexes ($components) from $mirror: check the network to Debian's mirror (or set DEBIAN_MIRROR) and that the suite still has the non-free component"
fi

wanted=()
for package in $required $optional; do
  if ! apt-cache "${apt_opts[@]}" show "$package=$debian_version" >/dev/null 2>&1; then
    case " $optional " in
      *" $package "*) step "$package is not packaged at $debian_version in $suite: skipped"; continue;;
    esac
    fail "package $package $debian_version not found in $suite ($components) on $mirror: check the network to Debian's mirror and that $suite's non-free component still carries nvidia-graphics-drivers $debian_version (apt-cache policy $package)"
  fi
  wanted+=("$package")
done

step "downloading ${#wanted[@]} packages ($suite, $debian_version)"
cd "$out.new/debs"
for package in "${wanted[@]}"; do
  if ! apt-get "${apt_opts[@]}" -q download "$package=$debian_version" >>"$apt_dir/download.log" 2>&1; then
    tail -n 5 "$apt_dir/download.log" >&2
    fail "downloading $package $debian_version from $suite ($components) on $mirror failed: check the network to Debian's mirror and the non-free component"
  fi
done

step "checking each .deb's sha256 against the index and unpacking"
: > "$out.new/packages.txt"
for package in "${wanted[@]}"; do
  record=$(apt-cache "${apt_opts[@]}" show "$package=$debian_version")
  sha=$(echo "$record" | awk '/^SHA256:/ {print $2; exit}')
  size=$(echo "$record" | awk '/^Size:/ {print $2; exit}')
  section=$(echo "$record" | awk '/^Section:/ {print $2; exit}')
  component=${section%%/*}; [ "$component" = "$section" ] && component=main
  deb=$(ls "${package}_"*"_amd64.deb")
  actual=$(sha256sum "$deb" | cut -d' ' -f1)
  [ "$actual" = "$sha" ] || fail "$deb: sha256 $actual is not the index's $sha: the download is damaged, run again"
  echo "$package $debian_version $component $size $sha" >> "$out.new/packages.txt"
  dpkg-deb -x "$deb" "$out.new/tree"
  dpkg-deb -e "$deb" "$out.new/control/$package"
done
echo "$upstream" > "$out.new/VERSION"
rm -rf "$apt_dir/cache" "$out.new/tree/usr/share/doc" "$out.new/tree/usr/share/lintian" "$out.new/tree/usr/share/bug"
echo "$stamp" > "$out.new/.stamp"
rm -rf "$out"
mv "$out.new" "$out"
step "done: ${#wanted[@]} packages, $(du -sh "$out/debs" | cut -f1) of .deb files, $(du -sh "$out/tree" | cut -f1) unpacked"
echo "$out"
