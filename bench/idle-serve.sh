#!/usr/bin/env bash
# bench/idle-serve.sh BINARY N [PORT]: the CPU and RSS of an idle `sidecar serve`
# with N active runs (BENCHMARKS.md, issue #12). It starts BINARY against the
# Conductor at $CONDUCTOR_URL (default http://127.0.0.1:8080/api), submits N
# runs of a one-step `sleep` plan that no worker polls (every executor's
# concurrency 0 but noop's), so they stay RUNNING with nothing in flight,
# waits 10 s, then reads the process's CPU time over 30 s from /proc and its
# RSS. With PPROF=1 it also writes a 30 s CPU profile to idle-N.prof.
# Needs python3. Stops only the process it started.
set -euo pipefail
BIN=${1:?usage: bench/idle-serve.sh BINARY N [PORT]}
N=${2:?usage: bench/idle-serve.sh BINARY N [PORT]}
PORT=${3:-18790}
CONDUCTOR_URL=${CONDUCTOR_URL:-http://127.0.0.1:8080/api}
D=$(mktemp -d)
args=(serve --data-dir "$D/data" --listen "127.0.0.1:$PORT" --conductor-url "$CONDUCTOR_URL"
  --insecure-no-auth --concurrency noop=1,sleep=0,command=0,http=0 --task-domain "idle$PORT$RANDOM")
if [ "${PPROF:-}" = 1 ]; then args+=(--pprof-listen "127.0.0.1:$((PORT + 1))"); fi
"$BIN" "${args[@]}" >"$D/log" 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "$D"' EXIT
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
python3 - "$PORT" "$N" <<'PY'
import json, sys, urllib.request, uuid
from concurrent.futures import ThreadPoolExecutor
port, n = sys.argv[1], int(sys.argv[2])
plan = {"planId": "idle-" + uuid.uuid4().hex[:8], "planVersion": "1",
        "steps": [{"stepId": "s", "executor": {"type": "sleep", "seconds": 1}}]}
def submit(_):
    body = json.dumps({"tenantId": "t", "projectId": "p", "environmentId": "e",
                       "runRequestId": uuid.uuid4().hex, "plan": plan}).encode()
    req = urllib.request.Request("http://127.0.0.1:%s/v1/runs" % port, data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=60).read()
with ThreadPoolExecutor(8) as pool:
    list(pool.map(submit, range(n)))
PY
sleep 10
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
t0=$(ticks); s0=$(date +%s.%N)
if [ "${PPROF:-}" = 1 ]; then
  curl -fs -o "idle-$N.prof" "http://127.0.0.1:$((PORT + 1))/debug/pprof/profile?seconds=30"
else
  sleep 30
fi
t1=$(ticks); s1=$(date +%s.%N)
rss=$(awk '/VmRSS/{print $2}' "/proc/$PID/status")
hz=$(getconf CLK_TCK)
python3 -c "print('runs=%d cpu=%.1f%% rss=%.0fMiB' % ($N, 100.0 * ($t1 - $t0) / $hz / ($s1 - $s0), $rss / 1024))"
