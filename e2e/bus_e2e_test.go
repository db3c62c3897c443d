package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// webhookConsumer is the receiving end of a webhook sink: it checks each
// request's signature and keeps the event ids in arrival order.
type webhookConsumer struct {
	t      *testing.T
	secret []byte
	delay  time.Duration
	mu     sync.Mutex
	got    []string
	bad    int
}

func (c *webhookConsumer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id, ts := r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp")
	time.Sleep(c.delay)
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.Header.Get("webhook-signature") != "v1,"+eventbus.Sign(c.secret, id, ts, body) {
		c.bad++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	c.got = append(c.got, id)
}

func (c *webhookConsumer) ids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got...)
}

// TestE2E_EventBusSurvivesKill: with a webhook sink and a NATS sink, 20
// runs on the real Conductor, and a kill -9 of the sidecar while the bus
// is behind the log: after the restart every persisted event reaches the
// webhook, each run's events first arrive in the log's order, and what is
// delivered twice is only what followed the sink's last saved cursor. The
// same kill checks the durable snapshots: the restarted sidecar projects
// the runs that had ended from their persisted snapshots, and every run's
// view is what its whole log reduces to.
func TestE2E_EventBusSurvivesKill(t *testing.T) {
	consumer := &webhookConsumer{t: t, secret: []byte("e2e-bus-secret-0123456789"), delay: 15 * time.Millisecond}
	hook := httptest.NewServer(consumer)
	t.Cleanup(hook.Close)
	secretFile := filepath.Join(t.TempDir(), "hook.key")
	if err := os.WriteFile(secretFile, consumer.secret, 0o600); err != nil {
		t.Fatal(err)
	}
	sinks := []string{"--bus-sink", "webhook:name=audit,url=" + hook.URL + ",secret-file=" + secretFile,
		"--bus-sink", "nats:name=ops,prefix=e2ebus,vocabulary=noetl"}
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr, sinks...)
	pl := &plan.Plan{PlanID: uniq("e2e-bus"), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
		{StepID: "b", DependsOn: []string{"a"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
		{StepID: "c", DependsOn: []string{"b"}, Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
	}}
	var runIDs []string
	for i := range 20 {
		runIDs = append(runIDs, submit(t, p, pl, fmt.Sprintf("bus-%d", i)).RunID)
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(consumer.ids()) < 30 {
		if time.Now().After(deadline) {
			t.Fatalf("the webhook got %d events in 60s", len(consumer.ids()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A run that ended has had its snapshot saved before the kill, so that
	// the restart has one to load. A run's end is saved when something
	// projects the run after it: reading the runs does, so the wait is on
	// the runs' progress, with a safety net of minutes (a loaded machine
	// may end no run for a while).
	sidecartest.WaitFor(t, "a persisted snapshot before the kill", 5*time.Minute, func() bool {
		for _, id := range runIDs {
			_, _ = p.client.Run(context.Background(), id)
		}
		return metricValue(t, p.addr, `sidecar_projector_durable_snapshots_total{outcome="saved"}`) > 0
	})
	p.stop(syscall.SIGKILL)
	before := len(consumer.ids())
	p = startServe(t, dataDir, addr, sinks...)
	var logs [][]statestore.RunEventRecord
	total := 0
	for _, id := range runIDs {
		v := waitTerminal(t, p, id, 120*time.Second)
		evs := allEvents(t, p, id)
		logs = append(logs, evs)
		total += len(evs)
		want, _ := statestore.Reduce(nil, evs)
		if v.Status != want.Status || v.LastEventSeq != want.LastEventSeq || len(v.Steps) != len(want.Steps) {
			t.Fatalf("run %s after the restart: %s at runSeq %d with %d steps; its log reduces to %s at %d with %d", id,
				v.Status, v.LastEventSeq, len(v.Steps), want.Status, want.LastEventSeq, len(want.Steps))
		}
	}
	if n := metricValue(t, p.addr, `sidecar_projector_durable_snapshots_total{outcome="loaded"}`); n == 0 {
		t.Fatal("the restarted sidecar loaded no persisted snapshot")
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		st, err := p.client.Bus(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		done := len(st.Sinks) == 2
		for _, s := range st.Sinks {
			done = done && s.Cursor == s.LastSeq
			if s.DeadLetters != 0 {
				t.Fatalf("sink %s has %d dead letters", s.Name, s.DeadLetters)
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sinks did not catch up with the log: %+v", st.Sinks)
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := consumer.ids()
	first := map[string]int{}
	for i, id := range got {
		if _, ok := first[id]; !ok {
			first[id] = i
		}
	}
	persisted := map[string]bool{}
	for _, evs := range logs {
		for _, e := range evs {
			persisted[e.EventID] = true
		}
	}
	for id := range first {
		if !persisted[id] {
			t.Fatalf("the webhook got event %s, which is in no run's log", id)
		}
	}
	for _, evs := range logs {
		last := -1
		for _, e := range evs {
			at, ok := first[e.EventID]
			if !ok {
				t.Fatalf("run %s: event %s (%s, runSeq %d) never reached the webhook", e.RunID, e.EventID, e.EventType, e.RunSeq)
			}
			if at < last {
				t.Fatalf("run %s: event %s (%s) first arrived before an earlier event of the run", e.RunID, e.EventID, e.EventType)
			}
			last = at
		}
	}
	if consumer.bad != 0 {
		t.Fatalf("%d requests with a bad signature", consumer.bad)
	}
	dup := len(got) - len(first)
	t.Logf("%d events in the runs' logs, %d deliveries (%d before the kill), %d delivered twice", total, len(got), before, dup)
	if dup > 1 {
		t.Fatalf("%d events delivered twice: a webhook's cursor is saved after each acknowledged event, so at most the one in flight at the kill repeats", dup)
	}
}
