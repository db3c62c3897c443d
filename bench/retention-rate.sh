#!/usr/bin/env bash
# bench/retention-rate.sh BASE_DIR RUNS: copy a generator's data dir
# (bench/genruns -removable, RUNS runs) and start serve on the copy with
# retention due at once (--retain-finished 1s, a file:// archive, Conductor's
# copy kept), then print every 10 s the runs removed and the rate since the
# last sample, whether the run list has read the whole log, and at the end
# the time to remove every run, the snapshots serve saved (each one a synced
# write to SIDECAR_SNAPSHOTS that the removal purges) and serve's CPU
# seconds per run removed.
# Needs a Conductor for serve to start (SIDECAR_CONDUCTOR_URL, default
# http://127.0.0.1:8080/api); nothing is sent to it (RETAIN_CONDUCTOR=true
# turns on the removal of a run's workflow, which finds none in a
# generator's runs and calls nothing). SIDECAR_BIN picks the
# binary, PORT the API's port (the next one is pprof), LIMIT_S the longest
# wait (default 1800).
set -euo pipefail
base=${1:?base data dir}
runs=${2:?runs in it}
bin=${SIDECAR_BIN:-/tmp/sidecar}
port=${PORT:-18991}
url=http://127.0.0.1:$port
work=$(mktemp -d "${TMPDIR:-/tmp}/retention-rate.XXXXXX")
cp -a "$base" "$work/data"
"$bin" serve --data-dir "$work/data" --listen 127.0.0.1:$port --pprof-listen 127.0.0.1:$((port+1)) \
  --conductor-url "${SIDECAR_CONDUCTOR_URL:-http://127.0.0.1:8080/api}" --task-domain "rate$port" \
  --retain-finished 1s --archive "file://$work/archive" --retain-conductor="${RETAIN_CONDUCTOR:-false}" >"$work/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
t0=$(date +%s.%N)
until curl -sf -o /dev/null "$url/readyz"; do sleep 0.1; kill -0 $pid; done
echo "$(basename "$bin"): ready after $(echo "$(date +%s.%N)-$t0" | bc) s"
prev=0 tprev=$t0 built=""
while :; do
  sleep 10
  now=$(date +%s.%N)
  removed=$(curl -s "$url/metrics" | awk '/^sidecar_retention_runs_removed_total /{printf "%d", $2}')
  removed=${removed:-0}
  if [ -z "$built" ]; then
    last=$(curl -s "$url/metrics" | awk '/^sidecar_log_last_sequence /{printf "%d", $2}')
    through=$(curl -s "$url/v1/runs?limit=1" | sed -n 's/.*"indexedThrough":\([0-9]*\).*/\1/p')
    [ -n "$last" ] && [ -n "$through" ] && [ "$through" -ge "$last" ] && built=$(echo "$now-$t0" | bc)
  fi
  echo "t=$(printf '%.0f' "$(echo "$now-$t0" | bc)") s removed $removed rate $(printf '%.1f' "$(echo "($removed-$prev)/($now-$tprev)" | bc -l)")/s list built ${built:-no} load $(cut -d' ' -f1 /proc/loadavg)"
  prev=$removed tprev=$now
  if [ "$removed" -ge "$runs" ] || [ "$(echo "$now-$t0 > ${LIMIT_S:-1800}" | bc)" = 1 ]; then break; fi
done
saved=$(curl -s "$url/metrics" | awk '/^sidecar_projector_durable_snapshots_total\{outcome="saved"\} /{printf "%d", $2}')
echo "$(basename "$bin"): snapshots saved ${saved:-?} ($(printf '%.2f' "$(echo "${saved:-0}/($removed+0.0001)" | bc -l)") a run removed)"
read -r ut st < <(awk '{print $14, $15}' /proc/$pid/stat)
cpu=$(echo "($ut+$st)/$(getconf CLK_TCK)" | bc -l)
echo "$(basename "$bin"): $removed of $runs removed in $(printf '%.0f' "$(echo "$(date +%s.%N)-$t0" | bc)") s; serve CPU $(printf '%.1f' "$cpu") s, $(printf '%.2f' "$(echo "$cpu*1000/($removed+0.0001)" | bc -l)") ms a run removed"
