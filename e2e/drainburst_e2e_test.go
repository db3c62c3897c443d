package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// burstRuns is how many drains end together in TestE2E_DrainDetectionBurst
// (SIDECAR_TEST_BURST_RUNS, default 32).
var burstRuns = func() int {
	if n, err := strconv.Atoi(os.Getenv("SIDECAR_TEST_BURST_RUNS")); err == nil && n > 0 {
		return n
	}
	return 32
}()

// TestE2E_DrainDetectionBurst: 32 runs paused with a step in flight, whose
// steps all end at once (a barrier file): every drain ends with
// RunDrainCompleted, after its step's StepCompleted, never before. It logs
// how long each drain's end took after its step's end (both persistedAt,
// the store's clock): the figures of docs/drain.md, "How fast a drain's end
// is seen".
func TestE2E_DrainDetectionBurst(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t), "--concurrency", fmt.Sprintf("command=%d", burstRuns))
	ctx := context.Background()
	barrier := filepath.Join(t.TempDir(), "go")
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-burst")+`","planVersion":"1","steps":[
		{"stepId":"work","executor":{"type":"command","argv":["bash","-c","while [ ! -e '`+barrier+`' ]; do sleep 0.05; done"]}}]}`)
	ids := make([]string, burstRuns)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < burstRuns; i += 8 {
				started, err := trySubmit(t, p, pl, uniq(fmt.Sprintf("req-%d", i)))
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = started.RunID
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, id := range ids {
		sidecartest.WaitFor(t, "every step to start", 2*time.Minute, func() bool {
			return eventIndex(allEvents(t, p, id), statestore.StepStarted, "work", 0) >= 0
		})
	}
	res, err := p.client.Bulk(ctx, "pause", httpapi.BulkRequest{PlanID: pl.PlanID, Reason: "burst"})
	if err != nil || res.Counts[httpapi.OutcomePaused] != burstRuns {
		t.Fatalf("bulk pause: %v %v", res, err)
	}
	if err := os.WriteFile(barrier, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var lat []time.Duration
	for _, id := range ids {
		var evs []statestore.RunEventRecord
		sidecartest.WaitFor(t, "the drain to end", 2*time.Minute, func() bool {
			evs = allEvents(t, p, id)
			_, how := drainEnd(t, evs)
			return how != ""
		})
		if _, how := drainEnd(t, evs); how != statestore.RunDrainCompleted {
			t.Fatalf("run %s: the drain ended with %s\n%v", id, how, types(evs))
		}
		done := eventIndex(evs, statestore.StepCompleted, "work", 0)
		end := eventIndex(evs, statestore.RunDrainCompleted, "", 0)
		if done < 0 || end < done {
			t.Fatalf("run %s: the drain ended before its step did\n%v", id, types(evs))
		}
		lat = append(lat, sinceEvent(evs, done, statestore.RunDrainCompleted))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	over := 0
	for _, d := range lat {
		if d > 250*time.Millisecond {
			over++
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("%d drains ending together: step end -> drain end p50 %v, p90 %v, max %v; %d over 250 ms; load %s",
		len(lat), lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*9/10].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), over, load)
	_, _ = p.client.Bulk(ctx, "cancel", httpapi.BulkRequest{PlanID: pl.PlanID, Reason: "test over"})
}
