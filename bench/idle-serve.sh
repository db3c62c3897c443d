#!/usr/bin/env bash
# bench/idle-serve.sh BINARY N [PORT]: the CPU and RSS of an idle `sidecar serve`
# with N active runs (BENCHMARKS.md, "Cost that grows with change, not with
# active runs"). It starts BINARY against the
# Conductor at $CONDUCTOR_URL (default http://127.0.0.1:8080/api), submits N
# runs of a one-step `sleep` plan that no worker polls (every executor's
# concurrency 0 but noop's), so they stay RUNNING with nothing in flight,
# waits SETTLE seconds (default 10), then reads the process's CPU time over
# 30 s from /proc, its RSS and its Go heap in use. With PPROF=1 it also writes
# a 30 s CPU profile to idle-N-running.prof and a heap profile to
# idle-N-running.heap.
# With PAUSED=1 it then pauses every run through the API (16 requests at a
# time, timed), measures again with all N runs PAUSED, and resumes them
# (timed); CONDUCTOR_PID adds Conductor's CPU during each to the report, and
# it prints how soon the pauses' drains ended (no step is in flight).
# At the end it cancels every run, so Conductor is left without them.
# STORE=postgres://... runs serve with --store (the log in PostgreSQL); PG_DATA
# (that cluster's data dir) adds the CPU of its server processes to the report.
# Needs python3 (bench/runs.py is its API client). Stops only the process it started.
set -euo pipefail
BIN=${1:?usage: bench/idle-serve.sh BINARY N [PORT]}
N=${2:?usage: bench/idle-serve.sh BINARY N [PORT]}
PORT=${3:-18790}
CONDUCTOR_URL=${CONDUCTOR_URL:-http://127.0.0.1:8080/api}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=$(mktemp -d)
args=(serve --data-dir "$D/data" --listen "127.0.0.1:$PORT" --conductor-url "$CONDUCTOR_URL"
  --insecure-no-auth --concurrency noop=1,sleep=0,command=0,http=0 --task-domain "idle$PORT$RANDOM")
if [ -n "${STORE:-}" ]; then args+=(--store "$STORE"); fi
if [ "${PPROF:-}" = 1 ]; then args+=(--pprof-listen "127.0.0.1:$((PORT + 1))"); fi
"$BIN" "${args[@]}" >"$D/log" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "$D"' EXIT
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
"$HERE/runs.py" submit "$PORT" "$N" "$D/runs"
SETTLE=${SETTLE:-10}
sleep "$SETTLE"
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
# pg_ticks: the CPU ticks of the PostgreSQL server at PG_DATA and its backends (0 without).
pg_ticks() {
  if [ -z "${PG_DATA:-}" ]; then echo 0; return; fi
  local pm
  pm=$(head -n 1 "$PG_DATA/postmaster.pid")
  for p in "$pm" $(pgrep -P "$pm"); do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || true; done | awk '{s += $1} END {print s + 0}'
}
# measure LABEL: the process's CPU over 30 s (a CPU profile with PPROF=1) and its RSS.
measure() {
  local t0 t1 s0 s1 rss hz
  t0=$(ticks); p0=$(pg_ticks); s0=$(date +%s.%N)
  if [ "${PPROF:-}" = 1 ]; then
    curl -fs -o "idle-$N-$1.prof" "http://127.0.0.1:$((PORT + 1))/debug/pprof/profile?seconds=30"
    curl -fs -o "idle-$N-$1.heap" "http://127.0.0.1:$((PORT + 1))/debug/pprof/heap"
  else
    sleep 30
  fi
  t1=$(ticks); p1=$(pg_ticks); s1=$(date +%s.%N)
  rss=$(awk '/VmRSS/{print $2}' "/proc/$PID/status")
  heap=$(curl -fs "http://127.0.0.1:$PORT/metrics" | awk '/^go_memstats_heap_inuse_bytes /{print $2}')
  hz=$(getconf CLK_TCK)
  python3 -c "print('runs=%d %s cpu=%.1f%% rss=%.0fMiB heap-inuse=%.0fMiB postgres-cpu=%.1f%%' % ($N, '$1', 100.0 * ($t1 - $t0) / $hz / ($s1 - $s0), $rss / 1024, ${heap:-0} / 1048576, 100.0 * ($p1 - $p0) / $hz / ($s1 - $s0)))"
}
measure running
# act ACTION: ACTION every run through the API, 16 requests at a time;
# prints the wall time, the rate and the latency percentiles.
act() {
  local a0 b0 s0 a1 b1 s1
  a0=$(ticks); b0=$(conductor_ticks); s0=$(date +%s.%N)
  "$HERE/runs.py" act "$PORT" "$1" "$D/runs"
  a1=$(ticks); b1=$(conductor_ticks); s1=$(date +%s.%N)
  python3 -c "print('  during $1: sidecar cpu=%.0f%% conductor cpu=%.0f%% (of one core)' % (100.0 * ($a1 - $a0) / $(getconf CLK_TCK) / ($s1 - $s0), 100.0 * ($b1 - $b0) / $(getconf CLK_TCK) / ($s1 - $s0)))"
}
# conductor_ticks: Conductor's CPU ticks (0 without CONDUCTOR_PID).
conductor_ticks() {
  if [ -n "${CONDUCTOR_PID:-}" ]; then awk '{print $14 + $15}' "/proc/$CONDUCTOR_PID/stat"; else echo 0; fi
}
# drains: how the pauses' drains ended, from sidecar_drain_duration_seconds.
drains() {
  curl -fs "http://127.0.0.1:$PORT/metrics" | python3 -c '
import re, sys
b, n, total = {}, 0, 0.0
for line in sys.stdin:
    if "outcome=\"drained\"" not in line: continue
    v = float(line.split()[-1])
    m = re.search(r"le=\"([^\"]+)\"", line)
    if line.startswith("sidecar_drain_duration_seconds_bucket") and m: b[m.group(1)] = v
    elif line.startswith("sidecar_drain_duration_seconds_count"): n = v
    elif line.startswith("sidecar_drain_duration_seconds_sum"): total = v
print("  drains ended: %d, within 0.1 s: %d, within 0.5 s: %d, mean %.3f s" % (n, b.get("0.1", 0), b.get("0.5", 0), total / n if n else 0))'
}
if [ "${PAUSED:-}" = 1 ]; then
  act pause
  sleep "$SETTLE"
  measure paused
  drains
  act resume
fi
# Leave Conductor as found: N RUNNING workflows nobody polls would cost it CPU
# in every later benchmark.
act cancel
