package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_AdmissionQueueSurvivesKill: under --max-active-runs 2 with the
// queue policy, eight runs on the real Conductor: two start, six are
// QUEUED (202, RunQueued, `sidecar status` shows the position); a kill -9
// of the sidecar while runs wait; after the restart every run completes,
// each started once, the queued ones in submission order, and the log
// never shows more than two active at once.
func TestE2E_AdmissionQueueSurvivesKill(t *testing.T) {
	t.Parallel() // its own serve and data dir
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	limits := []string{"--max-active-runs", "2", "--admission-policy", "queue"}
	p := startServe(t, dataDir, addr, limits...)
	pl := &plan.Plan{PlanID: uniq("e2e-admission"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "work", Executor: plan.ExecutorSpec{Type: plan.ExecutorSleep, Seconds: 1}},
	}}
	var ids []string
	for i := range 8 {
		started := submit(t, p, pl, fmt.Sprintf("adm-%d", i))
		ids = append(ids, started.RunID)
		if i >= 2 && started.Status != statestore.RunStatusQueued {
			t.Fatalf("run %d: %+v, want QUEUED", i, started)
		}
	}
	code, out, errOut := sidecartest.Run(t, "status", ids[7], "--server", "http://"+addr)
	if code != 0 || !strings.Contains(out, "QUEUED (position") {
		t.Fatalf("status of the last queued run: %d\n%s%s", code, out, errOut)
	}
	sidecartest.WaitFor(t, "a queued run to start", 60*time.Second, func() bool {
		return eventIndex(allEvents(t, p, ids[2]), statestore.RunStarted, "", 0) >= 0
	})
	p.stop(syscall.SIGKILL)
	p = startServe(t, dataDir, addr, limits...)
	type span struct {
		start, end string
		id         string
	}
	var spans []span
	for i, id := range ids {
		v := waitTerminal(t, p, id, 120*time.Second)
		if v.Status != statestore.RunStatusCompleted {
			t.Fatalf("run %d ended %s", i, v.Status)
		}
		evs := allEvents(t, p, id)
		runLevelEngineAttemptIsOne(t, evs)
		if n := count(evs, statestore.RunStarted, ""); n != 1 {
			t.Fatalf("run %d: %d RunStarted: %v", i, n, types(evs))
		}
		s := span{id: id}
		for _, e := range evs {
			switch e.EventType {
			case statestore.RunStarted:
				s.start = e.PersistedAt
			case statestore.RunCompleted:
				s.end = e.PersistedAt
			}
		}
		if i >= 2 && eventIndex(evs, statestore.RunQueued, "", 0) != 0 {
			t.Fatalf("queued run %d: log %v, want RunQueued first", i, types(evs))
		}
		spans = append(spans, s)
	}
	// The queued runs started in submission order.
	for i := 3; i < len(spans); i++ {
		if spans[i].start < spans[i-1].start {
			t.Fatalf("run %d started before run %d", i, i-1)
		}
	}
	// At most two active at any point of the log's time.
	type edge struct {
		at    string
		delta int
	}
	var edges []edge
	for _, s := range spans {
		edges = append(edges, edge{s.start, 1}, edge{s.end, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return parseTime(t, edges[i].at).Before(parseTime(t, edges[j].at))
		}
		return edges[i].delta < edges[j].delta
	})
	active, most := 0, 0
	for _, e := range edges {
		active += e.delta
		most = max(most, active)
	}
	if most > 2 {
		t.Fatalf("%d runs active at once in the log, limit 2", most)
	}
	st, err := p.client.Run(context.Background(), ids[7])
	if err != nil || st.QueuePosition != 0 {
		t.Fatalf("a started run still has a queue position: %+v %v", st, err)
	}
}

func parseTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
