#!/usr/bin/env bash
# Builds the S3-compatible server the archive tests write to: versitygw
# (Apache-2.0), the S3 gateway with a posix backend, from the Go module
# pinned in deploy/local/s3server (its go.mod `tool` line and go.sum), into a
# cache directory, and prints that directory. Idempotent: once built for
# this go.sum, it only prints the directory.
#
#   deploy/local/s3server.sh                  # -> ~/.cache/conductor-sidecar/s3server-<hash>
#   SIDECAR_TEST_S3SERVER="$(deploy/local/s3server.sh)/versitygw" go test ./archive/ ./retention/
#
# The tests start the server themselves (archive/archivetest: a free
# loopback port, a directory of their own, its root user's credentials) and
# stop it by its process. To run one by hand:
#
#   mkdir -p /tmp/s3/data /tmp/s3/meta
#   "$(deploy/local/s3server.sh)/versitygw" --access KEY --secret SECRET --port 127.0.0.1:7070 \
#     --keep-alive posix --sidecar /tmp/s3/meta /tmp/s3/data
#
# (--keep-alive: without it the server closes the connection after every
# request, so each of the archive's requests would open a new one.)
#
# Needs Go and the Go module proxy: a few minutes on 2 cores the first time
# (downloads included). S3SERVER_CACHE_DIR overrides the cache directory.
set -euo pipefail
cd "$(dirname "$0")/s3server"

cache="${S3SERVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/conductor-sidecar}"
sum=$(cat go.mod go.sum | sha256sum | cut -c1-12)
dir="$cache/s3server-$sum"

if [ -x "$dir/versitygw" ]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.s3server-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "s3server.sh: building versitygw (deploy/local/s3server, $sum)" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/versitygw" github.com/versity/versitygw/cmd/versitygw >&2
"$tmp/versitygw" --version >&2
mkdir -p "$dir"
# A rename: a concurrent build or reader sees the old binary or the new one.
mv -f "$tmp/versitygw" "$dir/versitygw"
echo "$dir"
