#!/usr/bin/env bash
# bench/replicas-idle.sh BINARY N R: the background cost of R sidecar replicas
# sharing N idle active runs on a 3-node NATS cluster (BENCHMARKS.md,
# "Replicas sharing the background work"). It starts the cluster
# (deploy/local/nats-cluster.sh, in a directory and on ports of its own), R
# `sidecar serve --nats-url ... --nats-replicas 3` against the Conductor at
# $CONDUCTOR_URL (default http://127.0.0.1:8080/api), submits N runs of a
# one-step `sleep` plan that no worker polls (so they stay RUNNING with
# nothing in flight), waits until the replicas count each other and SETTLE
# seconds more (default 15), then measures over 30 s: each replica's CPU, the sum,
# the NATS nodes' CPU, Conductor's (with CONDUCTOR_PID), the workflow reads and
# running-list calls the replicas made to Conductor (sidecar_conductor_requests_total)
# and the runs each watcher follows. At the end it cancels every run and stops
# what it started (by pid). Needs python3 and curl.
set -euo pipefail
BIN=${1:?usage: bench/replicas-idle.sh BINARY N R}
N=${2:?usage: bench/replicas-idle.sh BINARY N R}
R=${3:?usage: bench/replicas-idle.sh BINARY N R}
PORT=${PORT:-18800}
CONDUCTOR_URL=${CONDUCTOR_URL:-http://127.0.0.1:8080/api}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=$(mktemp -d)
export NATS_CLUSTER_DIR=$D/nats NATS_CLUSTER_PORT=${NATS_CLUSTER_PORT:-21222}
PIDS=()
cleanup() {
  local rc=$?
  if [ $rc != 0 ]; then
    for f in "$D"/log-*; do echo "--- $f (exit $rc)"; tail -n 40 "$f"; done >&2
    for i in $(seq "$R"); do p=${PIDS[$((i - 1))]:-}; [ -n "$p" ] && ! kill -0 "$p" 2>/dev/null && echo "replica $i (pid $p) is not running" >&2; done
  fi
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  "$HERE/../deploy/local/nats-cluster.sh" stop >/dev/null 2>&1 || true
  rm -rf "$D"
}
trap cleanup EXIT
"$HERE/../deploy/local/nats-cluster.sh" start >/dev/null
URL=$("$HERE/../deploy/local/nats-cluster.sh" url)
DOMAIN=idle$PORT$RANDOM
for i in $(seq "$R"); do
  "$BIN" serve --nats-url "$URL" --nats-replicas 3 --listen "127.0.0.1:$((PORT + i))" --conductor-url "$CONDUCTOR_URL" \
    --insecure-no-auth --concurrency noop=1,sleep=0,command=0,http=0 --task-domain "$DOMAIN" --worker-id "idle-$i" \
    >"$D/log-$i" 2>&1 &
  PIDS+=($!)
  ready=0
  for _ in $(seq 600); do curl -fs "http://127.0.0.1:$((PORT + i))/readyz" >/dev/null 2>&1 && ready=1 && break; sleep 0.1; done
  [ $ready = 1 ] || { echo "replica $i not ready after 60 s" >&2; exit 1; }
done
metric() { curl -fs "http://127.0.0.1:$1/metrics" | awk -v m="$2" 'index($0, m" ") == 1 || index($0, m"{") == 1 {s += $NF} END {print s + 0}'; }
for _ in $(seq 300); do
  ok=1
  for i in $(seq "$R"); do [ "$(metric $((PORT + i)) sidecar_members_live)" = "$R" ] || ok=0; done
  [ $ok = 1 ] && break
  sleep 0.1
done
"$HERE/runs.py" submit "$((PORT + 1))" "$N" "$D/runs"
sleep "${SETTLE:-15}"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
natspids() { cat "$NATS_CLUSTER_DIR"/n[123].pid 2>/dev/null || true; }
sum_ticks() { local s=0; for p in "$@"; do s=$((s + $(ticks "$p"))); done; echo $s; }
calls() { local s=0; for i in $(seq "$R"); do s=$((s + $(curl -fs "http://127.0.0.1:$((PORT + i))/metrics" | awk -v op="op=\"$1\"" 'index($0, "sidecar_conductor_requests_total{") == 1 && index($0, op) {s += $NF} END {print s + 0}'))); done; echo $s; }
declare -a t0
for i in $(seq "$R"); do t0[$i]=$(ticks "${PIDS[$((i - 1))]}"); done
n0=$(sum_ticks $(natspids)); c0=0; [ -n "${CONDUCTOR_PID:-}" ] && c0=$(ticks "$CONDUCTOR_PID")
g0=$(calls get_workflow); l0=$(calls running_workflows); s0=$(date +%s.%N)
sleep 30
s1=$(date +%s.%N); g1=$(calls get_workflow); l1=$(calls running_workflows)
n1=$(sum_ticks $(natspids)); c1=0; [ -n "${CONDUCTOR_PID:-}" ] && c1=$(ticks "$CONDUCTOR_PID")
HZ=$(getconf CLK_TCK)
total=0; per=""
for i in $(seq "$R"); do
  t=$(( $(ticks "${PIDS[$((i - 1))]}") - t0[$i] )); total=$((total + t))
  per="$per $(python3 -c "print('%.1f%%' % (100.0 * $t / $HZ / ($s1 - $s0)))")/$(metric $((PORT + i)) sidecar_run_watcher_active_runs)"
done
python3 -c "
el = $s1 - $s0
print('runs=%d replicas=%d sidecars cpu=%.1f%% (per replica cpu/runs followed:%s) nats cpu=%.1f%% conductor cpu=%.1f%% workflow reads=%.1f/s running lists=%.2f/s' % (
  $N, $R, 100.0 * $total / $HZ / el, '$per', 100.0 * ($n1 - $n0) / $HZ / el, 100.0 * ($c1 - $c0) / $HZ / el, ($g1 - $g0) / el, ($l1 - $l0) / el))"
"$HERE/runs.py" act "$((PORT + 1))" cancel "$D/runs" --ignore-errors >/dev/null
