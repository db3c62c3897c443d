#!/usr/bin/env python3
"""The benchmark scripts' client of the sidecar's API (bench/idle-serve.sh,
bench/replicas-idle.sh).

  runs.py submit PORT N OUT [T]   submit N runs of a one-step sleep plan (8 at a
                                  time) and write their runIds to OUT; with T,
                                  tenants t0..t(T-1) in turn (else tenant t)
  runs.py bulk PORT ACTION [T]    one bulk ACTION (pause, resume, cancel) of every
                                  run (all: true), or with T one per tenant
                                  t0..t(T-1) in turn; print the wall time and the
                                  outcomes' counts
  runs.py act PORT ACTION IDS     POST /v1/runs/{id}/ACTION for every runId in
                                  the file IDS, 16 at a time; print the wall time,
                                  the rate and the latency percentiles
  runs.py act PORT ACTION IDS --ignore-errors
                                  the same, going on past failed calls (cleanup)
"""
import json
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor


def post(port, path, body):
    req = urllib.request.Request("http://127.0.0.1:%s%s" % (port, path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=60).read()


def submit(port, n, out, tenants=0):
    plan = {"planId": "idle-" + uuid.uuid4().hex[:8], "planVersion": "1",
            "steps": [{"stepId": "s", "executor": {"type": "sleep", "seconds": 1}}]}

    def one(i):
        body = {"tenantId": "t%d" % (i % tenants) if tenants else "t", "projectId": "p", "environmentId": "e", "runRequestId": uuid.uuid4().hex, "plan": plan}
        return json.loads(post(port, "/v1/runs", body))["runId"]

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(one, range(n)))
    with open(out, "w") as f:
        f.write("\n".join(ids))


def bulk(port, action, tenants=0):
    filters = [{"tenantId": "t%d" % i} for i in range(tenants)] if tenants else [{"all": True}]
    counts, seen = {}, set()
    began = time.monotonic()
    for f in filters:
        body = dict(f, reason="bench")
        req = urllib.request.Request("http://127.0.0.1:%s/v1/runs:%s" % (port, action), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        res = json.loads(urllib.request.urlopen(req, timeout=600).read())
        for k, v in res["counts"].items():
            counts[k] = counts.get(k, 0) + v
        for r in res["runs"]:
            if r.get("error") and r["outcome"] not in seen:
                seen.add(r["outcome"])
                print("  e.g. %s %s (was %s): %s" % (r["outcome"], r["runId"], r["status"], r["error"]))
    took = time.monotonic() - began
    n = sum(counts.values())
    print("bulk %s runs=%d requests=%d took=%.1fs rate=%.0f/s counts=%s" % (action, n, len(filters), took, n / took if took else 0,
          json.dumps(counts, sort_keys=True)))


def act(port, action, ids_file, ignore_errors):
    with open(ids_file) as f:
        ids = f.read().split()

    def one(rid):
        began = time.monotonic()
        try:
            post(port, "/v1/runs/%s/%s" % (rid, action), {})
        except Exception:
            if not ignore_errors:
                raise
        return time.monotonic() - began

    began = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        lat = sorted(pool.map(one, ids))
    took = time.monotonic() - began
    if lat:
        print("%s runs=%d took=%.1fs rate=%.0f/s p50=%.0fms p99=%.0fms" % (action, len(ids), took, len(ids) / took,
              1000 * lat[len(lat) // 2], 1000 * lat[len(lat) * 99 // 100]))


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) in (4, 5) and a[0] == "submit":
        submit(a[1], int(a[2]), a[3], int(a[4]) if len(a) == 5 else 0)
    elif len(a) in (3, 4) and a[0] == "bulk":
        bulk(a[1], a[2], int(a[3]) if len(a) == 4 else 0)
    elif len(a) in (4, 5) and a[0] == "act" and (len(a) == 4 or a[4] == "--ignore-errors"):
        act(a[1], a[2], a[3], len(a) == 5)
    else:
        sys.exit(__doc__)
