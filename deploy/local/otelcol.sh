#!/usr/bin/env bash
# Builds the OpenTelemetry Collector the tracing tests send spans to, from
# the pinned Go modules of deploy/local/otelcol (the core collector with the
# OTLP receiver, gRPC and HTTP, and the file exporter), into a cache
# directory, and prints that directory. Idempotent: once built for this
# go.sum, it only prints the directory.
#
#   deploy/local/otelcol.sh                   # -> ~/.cache/conductor-sidecar/otelcol-<hash>
#   SIDECAR_TEST_OTELCOL="$(deploy/local/otelcol.sh)/otelcol" go test ./tracing/
#
# The tests start and stop the collector themselves, on free loopback
# ports, with a config of their own (tracing/tracingtest). Needs Go and the
# Go module proxy: about 2 minutes on 2 cores the first time (downloads
# included). OTELCOL_CACHE_DIR overrides the cache directory.
set -euo pipefail
cd "$(dirname "$0")/otelcol"

cache="${OTELCOL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/conductor-sidecar}"
sum=$(cat go.mod go.sum main.go | sha256sum | cut -c1-12)
dir="$cache/otelcol-$sum"

if [ -x "$dir/otelcol" ]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.otelcol-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "otelcol.sh: building the test collector (deploy/local/otelcol, $sum)" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/otelcol" . >&2
"$tmp/otelcol" --version >&2
mkdir -p "$dir"
# A rename: a concurrent build or reader sees the old binary or the new one.
mv -f "$tmp/otelcol" "$dir/otelcol"
echo "$dir"
