#!/usr/bin/env bash
# Installs Debian's chromium (the console's browser test drives it headless)
# when it is missing, and prints its path. Idempotent.
#
#   export SIDECAR_TEST_CHROMIUM="$(deploy/local/chromium.sh)"
#
# Needs root (or sudo) for apt-get.
set -euo pipefail

if p=$(command -v chromium || command -v chromium-browser); then
  echo "$p"
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "chromium.sh: chromium is missing and installing it needs root" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >&2
$sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
command -v chromium
