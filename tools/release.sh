#!/usr/bin/env bash
# `make release`: the artifacts of a release, built here, all of one version (pyproject.toml's
# project.version), into dist/ ($DIST overrides):
#
#   draplugin-<v>.tgz                  the chart (helm package), version and appVersion <v>, so its
#                                      default image tag is <v>; push it to any OCI registry:
#                                      helm push dist/draplugin-<v>.tgz oci://REGISTRY/charts
#   draplugin-image-<v>.oci.tar        our image (deploy/Dockerfile, built by
#                                      tests/cluster/build_image.sh with buildah), an OCI archive
#                                      whose one image is tagged <v>; push it to any registry:
#                                      skopeo copy oci-archive:dist/draplugin-image-<v>.oci.tar docker://REGISTRY/draplugin:<v>
#   draplugin-<v>-py3-none-any.whl     the package, with dra-controller and kubectl-dra:
#                                      pipx install dist/draplugin-<v>-py3-none-any.whl
#   SHA256SUMS
#
# docs/install.md says how to push and install them. Arguments name the parts to build (chart,
# image, wheel; default all three): the chart test packages the chart alone, as this script does.
# The chart's own Chart.yaml must carry the same version (a release is one number); the script
# refuses to package a chart that says otherwise rather than overriding it silently.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
dist=${DIST:-$repo/dist}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(chart image wheel)

step() { echo "release: $*" >&2; }
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
chart_dir=deploy/helm/draplugin
chart_field() { sed -n "s/^$1:[[:space:]]*\"\{0,1\}\([^\"]*\)\"\{0,1\}[[:space:]]*\$/\1/p" "$chart_dir/Chart.yaml"; }
for field in version appVersion; do
  if [ "$(chart_field "$field")" != "$version" ]; then
    echo "release: $chart_dir/Chart.yaml has $field $(chart_field "$field"), pyproject.toml version $version: make them one" >&2
    exit 1
  fi
done
mkdir -p "$dist"
made=()

for part in "${parts[@]}"; do
  case $part in
    chart)
      helm=$(tests/cluster/build_helm.sh)/helm
      # --version/--app-version restate Chart.yaml's (checked above): the archive carries exactly <v>.
      "$helm" package "$chart_dir" --version "$version" --app-version "$version" --destination "$dist" >&2
      made+=("draplugin-$version.tgz")
      ;;
    image)
      tests/cluster/build_image.sh >/dev/null
      # The image build_image.sh just built, also tagged localhost/draplugin:<v> in its private store
      # (the same store flags and lock as that script); pushed under the bare name draplugin:<v>, so
      # whoever copies it chooses the registry.
      cache=${DRA_IMAGE_CACHE:-$HOME/.cache/draplugin-images}
      buildah=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver overlay)
      archive=$dist/draplugin-image-$version.oci.tar
      rm -f "$archive"
      flock "$cache/.build.lock" "${buildah[@]}" push --quiet "localhost/draplugin:$version" \
        "oci-archive:$archive:draplugin:$version" >&2
      made+=("draplugin-image-$version.oci.tar")
      ;;
    wheel)
      # Built by the locked uv with the locked hatchling, hash-checked (the build group's export).
      rm -f "$dist/draplugin-$version-"*.whl
      "$repo/.venv/bin/uv" build --quiet --wheel --out-dir "$dist" \
        --build-constraints deploy/build-requirements.txt --require-hashes . >&2
      made+=("draplugin-$version-py3-none-any.whl")
      ;;
    *)
      echo "release: unknown part $part (chart, image or wheel)" >&2
      exit 2
      ;;
  esac
done

(cd "$dist" && sha256sum "${made[@]}" > SHA256SUMS)
for name in "${made[@]}"; do step "$dist/$name"; done
# The last lines: the artifacts' paths, for scripts and tests.
for name in "${made[@]}"; do echo "$dist/$name"; done
