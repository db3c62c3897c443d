#!/usr/bin/env bash
# Installs Prometheus and promtool from Debian's `prometheus` package when
# either is missing, without leaving a system Prometheus running, and prints
# the directory that holds both binaries. Idempotent: a second run only
# prints the directory.
#
#   deploy/prometheus/install.sh            # -> /usr/bin
#   export PATH="$(deploy/prometheus/install.sh):$PATH"
#
# Needs root (or sudo) for apt-get. Debian 12 gives Prometheus 2.42.
set -euo pipefail

bindir=/usr/bin

have() { command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; }

if have; then
  dirname "$(command -v promtool)"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "install.sh: prometheus/promtool are missing and installing them needs root" >&2; exit 1
  fi
fi

# Keep the package's maintainer scripts from starting the service: Debian's
# invoke-rc.d asks /usr/sbin/policy-rc.d, and exit 101 means "action
# forbidden". Only a policy file this script created is removed again.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  made_policy=1
fi
cleanup() { if [ "$made_policy" = 1 ]; then $sudo rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show prometheus >/dev/null 2>&1; then
  $sudo apt-get update -qq >&2
fi
$sudo apt-get install -y -qq --no-install-recommends prometheus >&2

# If the service was started anyway (a system with systemd, or an existing
# policy file that allowed it), stop it and keep it from starting at boot:
# tests and scripts start their own Prometheus on a free port.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  $sudo systemctl disable --now prometheus.service >/dev/null 2>&1 || true
elif [ -x /etc/init.d/prometheus ] && [ -e /run/prometheus/prometheus.pid ]; then
  # The package's init script started it (its pid file exists): stop that one.
  $sudo /etc/init.d/prometheus stop >/dev/null 2>&1 || true
fi

if ! [ -x "$bindir/prometheus" ] || ! [ -x "$bindir/promtool" ]; then
  echo "install.sh: the prometheus package did not install $bindir/prometheus and $bindir/promtool" >&2
  exit 1
fi
echo "$bindir"
