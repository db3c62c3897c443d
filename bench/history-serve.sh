#!/usr/bin/env bash
# bench/history-serve.sh DATA_DIR: start serve on a data dir that holds a long
# history (bench/genruns), and print start to ready, start to a listed run
# list, the first page of GET /v1/runs (median of 20), the run list's rows read
# at start (sidecar_runlist_start_rows_read) and serve's RSS.
# Needs a Conductor (SIDECAR_CONDUCTOR_URL, default http://127.0.0.1:8080/api).
# Optional: SERVE_ARGS (more flags for serve, e.g. retention), STATUS_RUN=ID
# (time GET /v1/runs/ID, median of 5), WAIT_BUILT=1 (then wait until the run
# list includes the whole log, and print when), HOLD=S (RSS again after S s),
# HEAP_PROFILE=f (a heap profile at the end).
set -euo pipefail
dir=${1:?data dir}
port=${PORT:-18787}
bin=${SIDECAR_BIN:-/tmp/rl-sidecar}
url=http://127.0.0.1:$port
t0=$(date +%s.%N)
# shellcheck disable=SC2086
"$bin" serve --data-dir "$dir" --listen 127.0.0.1:$port --pprof-listen 127.0.0.1:$((port+1)) \
  --conductor-url "${SIDECAR_CONDUCTOR_URL:-http://127.0.0.1:8080/api}" --task-domain "bench$port" ${SERVE_ARGS:-} \
  >"$dir.serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
until curl -sf -o /dev/null "$url/readyz"; do sleep 0.05; kill -0 $pid; done
t1=$(date +%s.%N)
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/runs?limit=50")" = 200 ]; do sleep 0.05; done
t2=$(date +%s.%N)
for _ in $(seq 20); do curl -s -o /dev/null -w '%{time_total}\n' "$url/v1/runs?limit=50"; done | sort -n > "$dir.page.txt"
rss=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
read_rows=$(curl -s "$url/metrics" | awk '/^sidecar_runlist_start_rows_read /{print $2}')
echo "ready $(echo "$t1-$t0" | bc) s; listed $(echo "$t2-$t0" | bc) s; first page median $(sed -n 10p "$dir.page.txt") s (min $(head -1 "$dir.page.txt"), max $(tail -1 "$dir.page.txt")); rows read at start ${read_rows:-?}; RSS $((rss/1024)) MiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "${STATUS_RUN:-}" ]; then
  for _ in $(seq 5); do curl -s -o /dev/null -w '%{http_code} %{time_total}\n' "$url/v1/runs/$STATUS_RUN"; done | sort -k2 -n > "$dir.status.txt"
  echo "status of $STATUS_RUN: median $(sed -n 3p "$dir.status.txt") s (min $(head -1 "$dir.status.txt"), max $(tail -1 "$dir.status.txt")); load $(cut -d' ' -f1-3 /proc/loadavg)"
fi
if [ -n "${WAIT_BUILT:-}" ]; then
  while :; do
    last=$(curl -s "$url/metrics" | awk '/^sidecar_log_last_sequence /{printf "%d", $2}')
    through=$(curl -s "$url/v1/runs?limit=1" | sed -n 's/.*"indexedThrough":\([0-9]*\).*/\1/p')
    [ -n "$last" ] && [ -n "$through" ] && [ "$through" -ge "$last" ] && break
    sleep 5
  done
  echo "run list built through $through after $(echo "$(date +%s.%N)-$t0" | bc) s; RSS $(( $(awk '/VmRSS/{print $2}' /proc/$pid/status)/1024 )) MiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
fi
if [ -n "${HEAP_PROFILE:-}" ]; then curl -s "http://127.0.0.1:$((port+1))/debug/pprof/heap" > "$HEAP_PROFILE"; fi
if [ -n "${HOLD:-}" ]; then sleep "$HOLD"; rss=$(awk '/VmRSS/{print $2}' /proc/$pid/status); echo "after ${HOLD}s: RSS $((rss/1024)) MiB; load $(cut -d' ' -f1-3 /proc/loadavg)"; fi
