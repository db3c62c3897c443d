#!/usr/bin/env bash
# Installs the official Conductor SDKs the end-to-end tests run workers
# with, through the task proxy, into a cache directory, and prints that
# directory. Idempotent: once installed for these pins, it only prints it.
#
#   export SIDECAR_TEST_SDKWORKERS="$(deploy/local/sdkworkers.sh)"
#   go test -count=1 -p 1 -run TestE2E_SDKWorker ./e2e
#
# What it installs (the pins live in the files named):
#   python/  a venv with conductor-python (e2e/testdata/sdkworkers/python/requirements.txt)
#   js/      @io-orkes/conductor-javascript (e2e/testdata/sdkworkers/js/package-lock.json, npm ci)
#   java/    the Java client's worker (e2e/testdata/sdkworkers/java/pom.xml), built into one jar
#            with its runtime classpath beside it
# A toolchain that is missing (python3, npm, mvn) is reported and its part
# skipped; the tests skip that SDK then (and fail under CI=true).
# SDKWORKERS_CACHE_DIR overrides the cache directory.
set -euo pipefail
src="$(cd "$(dirname "$0")/../../e2e/testdata/sdkworkers" && pwd)"
cache="${SDKWORKERS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/conductor-sidecar}"
mkdir -p "$cache"

# python: a venv per requirements.txt
sum=$(cat "$src/python/requirements.txt" | sha256sum | cut -c1-12)
py="$cache/sdk-python-$sum"
if [ ! -x "$py/bin/python" ]; then
  if command -v python3 >/dev/null 2>&1; then
    echo "sdkworkers.sh: python venv with $(tr '\n' ' ' < "$src/python/requirements.txt")" >&2
    rm -rf "$py.tmp" && python3 -m venv "$py.tmp" >&2
    "$py.tmp/bin/pip" install -q --disable-pip-version-check -r "$src/python/requirements.txt" >&2
    rm -rf "$py" && mv "$py.tmp" "$py"
  else
    echo "sdkworkers.sh: no python3, the Python SDK worker is skipped" >&2
  fi
fi
[ -x "$py/bin/python" ] && ln -sfn "$py" "$cache/sdk-python"

# js: npm ci per package-lock.json
sum=$(cat "$src/js/package.json" "$src/js/package-lock.json" | sha256sum | cut -c1-12)
js="$cache/sdk-js-$sum"
if [ ! -d "$js/node_modules/@io-orkes/conductor-javascript" ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "sdkworkers.sh: npm ci @io-orkes/conductor-javascript" >&2
    rm -rf "$js.tmp" && mkdir -p "$js.tmp"
    cp "$src/js/package.json" "$src/js/package-lock.json" "$src/js/.npmrc" "$js.tmp/"
    (cd "$js.tmp" && npm ci --silent --no-audit --no-fund >&2)
    rm -rf "$js" && mv "$js.tmp" "$js"
  else
    echo "sdkworkers.sh: no npm, the JavaScript SDK worker is skipped" >&2
  fi
fi
[ -d "$js/node_modules" ] && ln -sfn "$js" "$cache/sdk-js"

# java: mvn package per pom.xml and source
sum=$(cat "$src/java/pom.xml" $(find "$src/java/src" -type f | sort) | sha256sum | cut -c1-12)
jv="$cache/sdk-java-$sum"
if [ ! -f "$jv/worker.jar" ]; then
  if command -v mvn >/dev/null 2>&1 && command -v java >/dev/null 2>&1; then
    echo "sdkworkers.sh: mvn package (the Java client's worker)" >&2
    rm -rf "$jv.tmp" && mkdir -p "$jv.tmp"
    cp -r "$src/java/pom.xml" "$src/java/src" "$jv.tmp/"
    (cd "$jv.tmp" && mvn -q -B package dependency:copy-dependencies -DoutputDirectory=lib -DincludeScope=runtime >&2)
    cp "$jv.tmp"/target/*.jar "$jv.tmp/worker.jar"
    rm -rf "$jv" && mv "$jv.tmp" "$jv"
  else
    echo "sdkworkers.sh: no mvn or java, the Java SDK worker is skipped" >&2
  fi
fi
[ -f "$jv/worker.jar" ] && ln -sfn "$jv" "$cache/sdk-java"
echo "$cache"
