#!/usr/bin/env bash
# bench/bulk-serve.sh BINARY N [PORT]: bulk pause, resume and cancel of N
# running runs through one `sidecar serve` (BENCHMARKS.md, "Bulk control of
# 10,000 runs"). It starts BINARY against the Conductor at $CONDUCTOR_URL
# (default http://127.0.0.1:8080/api), submits N runs of a one-step `sleep`
# plan that no worker polls (RUNNING, nothing in flight), waits SETTLE
# seconds (default 10), then pauses every run with bulk requests, resumes
# them, and cancels them, and reports for each: the wall time, serve's CPU
# and (with CONDUCTOR_PID) Conductor's over it, and serve's writes per run
# from its /metrics (persisted appends, registry entries written, run-list
# rows), and serve's RSS with every run paused. TENANTS=T submits the runs over tenants t0..t(T-1) and sends one
# bulk request per tenant (a build whose bulk action takes fewer runs than
# N); without it one request (all: true) acts on every run. PROFILE_DIR=DIR
# writes a CPU profile of serve over the first PROFILE_SECONDS (default 20)
# of each request to DIR/<action>.prof, and its heap with every run paused to
# DIR/paused.heap (serve's --pprof-listen on PORT+1).
# STORE=postgres://... runs serve with --store (the log and the registry in
# PostgreSQL); PG_DATA (that cluster's data dir) adds the CPU of its server
# processes per run to the report. SERVE_ENV="NAME=VALUE ..." sets extra
# environment for serve (e.g. GOMEMLIMIT=150MiB). With every run paused
# it also prints Go's heap in use and held (go_memstats_heap_*); LATER=S
# samples RSS and heap again S seconds on. PAUSE_ONLY=1 stops after the
# paused measurement (the runs stay paused in Conductor: restart a
# Conductor of its own with the memory store to drop them).
# Needs python3 (bench/runs.py). Stops only the process it started.
set -euo pipefail
BIN=${1:?usage: bench/bulk-serve.sh BINARY N [PORT]}
N=${2:?usage: bench/bulk-serve.sh BINARY N [PORT]}
PORT=${3:-18794}
CONDUCTOR_URL=${CONDUCTOR_URL:-http://127.0.0.1:8080/api}
TENANTS=${TENANTS:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=$(mktemp -d)
env ${SERVE_ENV:-} "$BIN" serve --data-dir "$D/data" --listen "127.0.0.1:$PORT" --conductor-url "$CONDUCTOR_URL" \
  ${STORE:+--store "$STORE"} ${PROFILE_DIR:+--pprof-listen "127.0.0.1:$((PORT + 1))"} --insecure-no-auth --concurrency noop=1,sleep=0,command=0,http=0 --task-domain "bulk$PORT$RANDOM" >"$D/log" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "$D"' EXIT
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
"$HERE/runs.py" submit "$PORT" "$N" "$D/runs" ${TENANTS:+"$TENANTS"}
sleep "${SETTLE:-10}"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
conductor_ticks() { if [ -n "${CONDUCTOR_PID:-}" ]; then ticks "$CONDUCTOR_PID"; else echo 0; fi; }
# pg_ticks: the CPU ticks of the PostgreSQL server at PG_DATA and its backends (0 without).
pg_ticks() {
  if [ -z "${PG_DATA:-}" ]; then echo 0; return; fi
  local pm
  pm=$(head -n 1 "$PG_DATA/postmaster.pid")
  for p in "$pm" $(pgrep -P "$pm"); do awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || true; done | awk '{s += $1} END {print s + 0}'
}
# writes: persisted appends + registry writes + run-list rows, from /metrics.
writes() {
  curl -fs "http://127.0.0.1:$PORT/metrics" | python3 -c '
import sys
n = 0.0
for line in sys.stdin:
    if line.startswith("#"): continue
    if (line.startswith("sidecar_store_appends_total{") and "result=\"persisted\"" in line) or \
       (line.startswith("sidecar_registry_operations_total{") and ("result=\"created\"" in line or "result=\"adopted\"" in line)) or \
       line.startswith("sidecar_runlist_row_writes_total"):
        n += float(line.split()[-1])
print(n)'
}
# bulk ACTION: the bulk ACTION of every run, with its cost.
bulk() {
  local a0 b0 w0 p0 a1 b1 w1 p1 hz load prof=
  hz=$(getconf CLK_TCK)
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  a0=$(ticks "$PID"); b0=$(conductor_ticks); w0=$(writes); p0=$(pg_ticks)
  if [ -n "${PROFILE_DIR:-}" ]; then
    curl -fs -o "$PROFILE_DIR/$1.prof" "http://127.0.0.1:$((PORT + 1))/debug/pprof/profile?seconds=${PROFILE_SECONDS:-20}" &
    prof=$!
  fi
  "$HERE/runs.py" bulk "$PORT" "$1" ${TENANTS:+"$TENANTS"}
  if [ -n "$prof" ]; then wait "$prof" || true; fi
  a1=$(ticks "$PID"); b1=$(conductor_ticks); w1=$(writes); p1=$(pg_ticks)
  python3 -c "print('  %s: serve cpu=%.2f ms/run, conductor cpu=%.2f ms/run, postgres cpu=%.2f ms/run, writes=%.2f/run (load before: $load)' % ('$1', 1000.0 * ($a1 - $a0) / $hz / $N, 1000.0 * ($b1 - $b0) / $hz / $N, 1000.0 * ($p1 - $p0) / $hz / $N, ($w1 - $w0) / $N))"
}
bulk pause
sleep "${SETTLE:-10}"
# serve's resident memory with every run paused (VmRSS; VmHWM is the peak so far).
grep -E '^Vm(RSS|HWM)' "/proc/$PID/status" | tr -s ' \t' ' ' | sed 's/^/  paused: /'
# and Go's heap then: in use (live plus not yet collected) and what it holds from the system.
curl -fs "http://127.0.0.1:$PORT/metrics" | awk '/^go_memstats_heap_(inuse|sys)_bytes /{printf "  paused: %s %.1f MB\n", $1, $2 / 1e6}'
if [ -n "${PROFILE_DIR:-}" ]; then
  curl -fs -o "$PROFILE_DIR/paused.heap" "http://127.0.0.1:$((PORT + 1))/debug/pprof/heap"
fi
# LATER=S samples the same again S seconds on (e.g. 150: after Go's
# periodic collection, every 2 minutes, has run on the idle serve).
if [ -n "${LATER:-}" ]; then
  sleep "$LATER"
  grep -E '^Vm(RSS|HWM)' "/proc/$PID/status" | tr -s ' \t' ' ' | sed "s/^/  paused +${LATER}s: /"
  curl -fs "http://127.0.0.1:$PORT/metrics" | awk -v l="$LATER" '/^go_memstats_heap_(inuse|sys|released)_bytes /{printf "  paused +%ss: %s %.1f MB\n", l, $1, $2 / 1e6}'
fi
if [ -n "${PAUSE_ONLY:-}" ]; then exit 0; fi
bulk resume
sleep "${SETTLE:-10}"
bulk cancel
