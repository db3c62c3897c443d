#!/usr/bin/env bash
# bench/adopted-bulk.sh BINARY N [PORT]: bulk pause, resume and cancel of N
# adopted workflows through one `sidecar serve` (BENCHMARKS.md, "Bulk
# control of adopted workflows"). It registers a definition of one WAIT of an
# hour in the Conductor at $CONDUCTOR_URL (default
# http://127.0.0.1:8080/api), starts BINARY with --adopt for it, starts N
# workflows in Conductor (as any client of Conductor does), waits until serve
# has adopted them all (RUNNING, nothing in flight), then pauses, resumes and
# cancels every run with one bulk request each, and reports for each: the
# wall time, serve's CPU and (with CONDUCTOR_PID) Conductor's per run, and
# the adopter's reads of Conductor per run, by reason. Needs python3.
# Stops only the process it started; the cancel terminates the workflows.
set -euo pipefail
BIN=${1:?usage: bench/adopted-bulk.sh BINARY N [PORT]}
N=${2:?usage: bench/adopted-bulk.sh BINARY N [PORT]}
PORT=${3:-18894}
CONDUCTOR_URL=${CONDUCTOR_URL:-http://127.0.0.1:8080/api}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=bench_adopted_$RANDOM$RANDOM
D=$(mktemp -d)
curl -fsS -X POST -H 'Content-Type: application/json' "$CONDUCTOR_URL/metadata/workflow" -d '{"name":"'"$NAME"'","version":1,"schemaVersion":2,"ownerEmail":"bench@example.com",
  "tasks":[{"name":"hold","taskReferenceName":"hold","type":"WAIT","inputParameters":{"duration":"60 minutes"}}]}' >/dev/null
"$BIN" serve --data-dir "$D/data" --listen "127.0.0.1:$PORT" --conductor-url "$CONDUCTOR_URL" --insecure-no-auth \
  --concurrency noop=0,sleep=0,command=0,http=0 --task-domain "adopt$PORT$RANDOM" --adopt "$NAME" >"$D/log" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "$D"' EXIT
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
python3 - "$CONDUCTOR_URL" "$NAME" "$N" <<'PY'
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
url, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def one(i):
    req = urllib.request.Request(url + "/workflow", data=json.dumps({"name": name, "version": 1, "input": {}}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=60).read()
with ThreadPoolExecutor(8) as pool:
    list(pool.map(one, range(n)))
PY
metric() { curl -fs "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {print s + 0}'; }
for _ in $(seq 600); do [ "$(metric sidecar_adopter_adopted_total)" -ge "$N" ] && break; sleep 1; done
echo "  adopted: $(metric sidecar_adopter_adopted_total) of $N"
sleep "${SETTLE:-10}"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
conductor_ticks() { if [ -n "${CONDUCTOR_PID:-}" ]; then ticks "$CONDUCTOR_PID"; else echo 0; fi; }
reads() { curl -fs "http://127.0.0.1:$PORT/metrics" | awk '/^sidecar_adopter_reads_total\{/ {gsub(/.*reason="/, "", $1); gsub(/".*/, "", $1); printf "%s=%s ", $1, $2}'; }
bulk() {
  local a0 b0 a1 b1 hz r0 r1
  hz=$(getconf CLK_TCK)
  a0=$(ticks "$PID"); b0=$(conductor_ticks); r0=$(reads)
  "$HERE/runs.py" bulk "$PORT" "$1"
  a1=$(ticks "$PID"); b1=$(conductor_ticks); r1=$(reads)
  python3 -c "print('  %s: serve cpu=%.2f ms/run, conductor cpu=%.2f ms/run (load: $(cut -d' ' -f1-3 /proc/loadavg))' % ('$1', 1000.0 * ($a1 - $a0) / $hz / $N, 1000.0 * ($b1 - $b0) / $hz / $N))"
  echo "  $1: adopter reads before: $r0"
  echo "  $1: adopter reads after:  $r1"
}
bulk pause
sleep "${SETTLE:-10}"
bulk resume
sleep "${SETTLE:-10}"
bulk cancel
