#!/usr/bin/env bash
# bench/archived-serve.sh DATA_DIR ARCHIVE_DIR: start serve with retention on
# (--archive file://ARCHIVE_DIR) on a data dir holding a window of finished
# runs (bench/genruns, run list built) beside a large archive (the archive
# benchmark's generator), and print start to ready, RSS at ready and HOLD s
# later, the first page of GET /v1/runs (median of 20), the first page with
# include=archived (the first, then median of 5), and `sidecar status` of
# archived runs (the first after the start, then median of 10 per run).
# Needs a Conductor (SIDECAR_CONDUCTOR_URL, default http://127.0.0.1:8080/api).
# Optional: RETAIN (--retain-finished, default 24h: nothing due), STATUS_RUNS
# (space-separated run ids in the archive), HOLD (default 120), HEAP_PROFILE=f
# (a heap profile at the end), SERVE_ARGS (more flags).
# From ready on, a sampler writes DATA_DIR.samples.txt once a second (seconds
# since ready, RSS MiB, runs removed); the end prints the peak RSS, the first
# removal's delay after ready and the removal rate from those samples.
set -euo pipefail
dir=${1:?data dir}
arch=${2:?archive dir}
port=${PORT:-18921}
bin=${SIDECAR_BIN:-/tmp/m1-bin}
url=http://127.0.0.1:$port
load() { cut -d' ' -f1-3 /proc/loadavg; }
rss() { echo $(( $(awk '/VmRSS/{print $2}' /proc/$pid/status) / 1024 )); }
t0=$(date +%s.%N)
# shellcheck disable=SC2086
"$bin" serve --data-dir "$dir" --listen 127.0.0.1:$port --pprof-listen 127.0.0.1:$((port+1)) \
  --conductor-url "${SIDECAR_CONDUCTOR_URL:-http://127.0.0.1:8080/api}" --task-domain "bench$port" \
  --archive "file://$arch" --retain-finished "${RETAIN:-24h}" --retain-conductor=false ${SERVE_ARGS:-} \
  >"$dir.serve.log" 2>&1 &
pid=$!
sampler=
trap 'kill $sampler $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
until curl -sf -o /dev/null "$url/readyz"; do sleep 0.05; kill -0 $pid; done
t1=$(date +%s.%N)
removed() { curl -s "$url/metrics" | awk '/^sidecar_retention_runs_removed_total /{n=$2} END{printf "%d", n}'; }
while :; do
  echo "$(echo "$(date +%s.%N)-$t1" | bc) $(rss) $(removed)"
  sleep 1
done >"$dir.samples.txt" 2>/dev/null &
sampler=$!
echo "ready $(echo "$t1-$t0" | bc) s; RSS $(rss) MiB; load $(load)"
for _ in $(seq 20); do curl -s -o /dev/null -w '%{time_total}\n' "$url/v1/runs?limit=50"; done | sort -n > "$dir.page.txt"
echo "first page median $(sed -n 10p "$dir.page.txt") s (min $(head -1 "$dir.page.txt"), max $(tail -1 "$dir.page.txt")); load $(load)"
for _ in $(seq 6); do curl -s -o "$dir.archived.json" -w '%{http_code} %{time_total}\n' "$url/v1/runs?limit=50&include=archived"; done > "$dir.archived.txt"
echo "include=archived: first $(head -1 "$dir.archived.txt"), then median $(tail -5 "$dir.archived.txt" | sort -k2 -n | sed -n 3p) s; runs on the page: $(grep -o '"runId"' "$dir.archived.json" | wc -l), archived: $(grep -o '"archived":true' "$dir.archived.json" | wc -l)"
for run in ${STATUS_RUNS:-}; do
  for _ in $(seq 11); do
    s=$(date +%s.%N)
    "$bin" status "$run" --server "$url" >/dev/null
    echo "$(date +%s.%N) - $s" | bc
  done > "$dir.status.txt"
  echo "status $run: first $(head -1 "$dir.status.txt") s, then median $(tail -10 "$dir.status.txt" | sort -n | sed -n 5p) s (max $(tail -10 "$dir.status.txt" | sort -n | tail -1)); load $(load)"
done
if [ -n "${HOLD:-120}" ]; then
  sleep "${HOLD:-120}"
  removed=$(curl -s "$url/metrics" | awk '/^sidecar_retention_runs_removed_total /{print $2}')
  echo "after ${HOLD:-120}s: RSS $(rss) MiB; runs removed ${removed:-?}; CPU $(awk '{print ($14+$15)/100}' /proc/$pid/stat) s; load $(load)"
fi
awk 'NF==3 { if ($2>peak) peak=$2; if ($3>0 && first=="") {first=$1; n0=$3} if ($3>n) changed=$1; n=$3 }
  END { printf "samples: peak RSS %d MiB", peak;
        if (first=="") print "; no run removed"; else printf "; first removal %.1f s after ready; %d removed, %.0f runs/s from the first removal to the last\n", first, n, (changed>first ? (n-n0)/(changed-first) : 0) }' "$dir.samples.txt"
if [ -n "${HEAP_PROFILE:-}" ]; then curl -s "http://127.0.0.1:$((port+1))/debug/pprof/heap" > "$HEAP_PROFILE"; fi
