#!/usr/bin/env bash
# bench/history-serve.sh DATA_DIR: start serve on a data dir that holds a long
# history (bench/genruns), and print start to ready, start to a listed run
# list, the first page of GET /v1/runs (median of 20), and serve's RSS.
# Needs a Conductor (SIDECAR_CONDUCTOR_URL, default http://127.0.0.1:8080/api).
set -euo pipefail
dir=${1:?data dir}
port=${PORT:-18787}
bin=${SIDECAR_BIN:-/tmp/rl-sidecar}
url=http://127.0.0.1:$port
t0=$(date +%s.%N)
"$bin" serve --data-dir "$dir" --listen 127.0.0.1:$port --pprof-listen 127.0.0.1:$((port+1)) \
  --conductor-url "${SIDECAR_CONDUCTOR_URL:-http://127.0.0.1:8080/api}" --task-domain "bench$port" \
  >"$dir.serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
until curl -sf -o /dev/null "$url/readyz"; do sleep 0.05; kill -0 $pid; done
t1=$(date +%s.%N)
until [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/runs?limit=50")" = 200 ]; do sleep 0.05; done
t2=$(date +%s.%N)
for _ in $(seq 20); do curl -s -o /dev/null -w '%{time_total}\n' "$url/v1/runs?limit=50"; done | sort -n > "$dir.page.txt"
rss=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
echo "ready $(echo "$t1-$t0" | bc) s; listed $(echo "$t2-$t0" | bc) s; first page median $(sed -n 10p "$dir.page.txt") s (min $(head -1 "$dir.page.txt"), max $(tail -1 "$dir.page.txt")); RSS $((rss/1024)) MiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "${HEAP_PROFILE:-}" ]; then curl -s "http://127.0.0.1:$((port+1))/debug/pprof/heap" > "$HEAP_PROFILE"; fi
if [ -n "${HOLD:-}" ]; then sleep "$HOLD"; rss=$(awk '/VmRSS/{print $2}' /proc/$pid/status); echo "after ${HOLD}s: RSS $((rss/1024)) MiB"; fi
