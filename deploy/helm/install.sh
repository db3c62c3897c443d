#!/usr/bin/env bash
# Builds helm at the version this repository pins, from its Go module (no
# download of a release binary), into a cache directory, and prints that
# directory. Idempotent: once built, it only prints the directory.
#
#   deploy/helm/install.sh                    # -> ~/.cache/conductor-sidecar/helm-v3.22.0
#   export PATH="$(deploy/helm/install.sh):$PATH"
#
# Needs Go and the Go module proxy (about 4 minutes on 2 cores the first
# time). HELM_CACHE_DIR overrides the cache directory.
set -euo pipefail

version=v3.22.0
# The Kubernetes version helm assumes without a cluster (helm template,
# lint): that of the client-go helm's go.mod requires, as helm's Makefile
# stamps it into a release build.
k8s_major=1 k8s_minor=37

cache="${HELM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/conductor-sidecar}"
dir="$cache/helm-$version"

if [ -x "$dir/helm" ] && [ "$("$dir/helm" version --template '{{.Version}}' 2>/dev/null)" = "$version" ]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.helm-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  ldflags+=" -X $pkg.k8sVersionMajor=$k8s_major -X $pkg.k8sVersionMinor=$k8s_minor"
done
echo "install.sh: building helm $version (go install helm.sh/helm/v3/cmd/helm@$version)" >&2
(cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp/bin" GOFLAGS=-mod=mod go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$version") >&2
got=$("$tmp/bin/helm" version --template '{{.Version}}')
if [ "$got" != "$version" ]; then
  echo "install.sh: built helm says version $got, want $version" >&2
  exit 1
fi
mkdir -p "$dir"
# A rename: a concurrent build or reader sees the old binary or the new one.
mv -f "$tmp/bin/helm" "$dir/helm"
echo "$dir"
