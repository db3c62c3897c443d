package e2e

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestE2E_BulkControl: 200 runs selected by label and plan (20 others not)
// are listed by a dry run that changes nothing, paused in one request while
// more runs start (each of those whose start returned before the answer
// is in it), the request repeated with its Idempotency-Key answers the
// same and records nothing, `pause --wait` follows the drains, and a
// staggered resume (100 now, 100 per 4 s) outlives a kill -9 of the
// sidecar: every run resumed once, none before its time.
func TestE2E_BulkControl(t *testing.T) {
	t.Parallel() // its own serve and data dir
	dataDir, addr := t.TempDir(), sidecartest.FreeAddr(t)
	p := startServe(t, dataDir, addr, "--concurrency", "command=16")
	server := "http://" + addr
	ctx := context.Background()
	// Every step waits for the barrier file, which the test creates once
	// the bulk pause is done: no run can end before it is selected.
	barrier := filepath.Join(t.TempDir(), "go")
	pl := mustPlan(t, `{"planId":"`+uniq("e2e-bulk")+`","planVersion":"1","steps":[
		{"stepId":"work","executor":{"type":"command","argv":["bash","-c","while [ ! -e '`+barrier+`' ]; do sleep 0.1; done"]}}]}`)
	start := func(labels map[string]string) string {
		req := httpapi.StartRequest{TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test", RunRequestID: uniq("req"), Plan: pl, Labels: labels}
		for try := 0; ; try++ {
			s, err := p.client.Start(ctx, req)
			if err == nil {
				return s.RunID
			}
			if try == 5 {
				t.Error(err)
				return ""
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	var mu sync.Mutex
	var data, web []string
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 220; i += 8 {
				labels := map[string]string{"team": "data", "tier": []string{"gold", "silver"}[i%2]}
				if i >= 200 {
					labels = map[string]string{"team": "web"}
				}
				id := start(labels)
				mu.Lock()
				if i >= 200 {
					web = append(web, id)
				} else {
					data = append(data, id)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	defer func() {
		_, _ = p.client.Bulk(ctx, "cancel", httpapi.BulkRequest{PlanID: pl.PlanID, Reason: "test over"})
	}()
	countPaused := func() int {
		t.Helper()
		l, err := listAll(ctx, p.client, url.Values{"planId": {pl.PlanID}, "status": {"PAUSED"}})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Runs)
	}

	// The dry run lists exactly the 200 and changes nothing.
	code, out, errOut := sidecartest.Run(t, "pause", "-l", "team=data", "--plan", pl.PlanID, "--reason", "incident 9", "--dry-run", "-o", "json", "--server", server)
	var dry httpapi.BulkResult
	if code != 0 || json.Unmarshal([]byte(out), &dry) != nil {
		t.Fatalf("pause --dry-run: exit %d: %s%s", code, out, errOut)
	}
	var dryIDs []string
	inFlight := 0
	for _, r := range dry.Runs {
		dryIDs = append(dryIDs, r.RunID)
		if r.Outcome != httpapi.OutcomeWould {
			t.Fatalf("dry run: %s %s, want %s", r.RunID, r.Outcome, httpapi.OutcomeWould)
		}
		inFlight += len(r.InFlightStepIDs)
	}
	slices.Sort(dryIDs)
	slices.Sort(data)
	if !slices.Equal(dryIDs, data) {
		t.Fatalf("the dry run selected %d runs, want the 200 of team=data", len(dryIDs))
	}
	t.Logf("dry run: 200 runs, %d steps in flight", inFlight)
	if n := countPaused(); n != 0 {
		t.Fatalf("after a dry run %d runs are paused", n)
	}
	if code, _, errOut := sidecartest.Run(t, "pause", "-l", "team=data", "--server", server); code != sidecartest.ExitUsage {
		t.Fatalf("a bulk pause without --reason: exit %d %s", code, errOut)
	}

	// The pause, while 10 more team=data runs start.
	type late struct {
		id       string
		returned time.Time
	}
	lates := make(chan late, 10)
	go func() {
		for range 10 {
			id := start(map[string]string{"team": "data", "tier": "gold"})
			lates <- late{id, time.Now()}
		}
		close(lates)
	}()
	time.Sleep(100 * time.Millisecond)
	keyed := httpapi.NewClient(server)
	keyed.IdempotencyKey = uniq("bulk-pause")
	req := httpapi.BulkRequest{LabelSelector: "team=data", PlanID: pl.PlanID, Reason: "incident 9", RequestedBy: "oncall-jane"}
	res, err := keyed.Bulk(ctx, "pause", req)
	answered := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range res.Runs {
		got[r.RunID] = r.Outcome
	}
	for _, id := range data {
		if got[id] != httpapi.OutcomePaused {
			t.Errorf("run %s: %q, want paused", id, got[id])
		}
	}
	for _, id := range web {
		if _, ok := got[id]; ok {
			t.Errorf("run %s of team=web was selected", id)
		}
	}
	for l := range lates {
		if o, ok := got[l.id]; l.returned.Before(answered) && (!ok || (o != httpapi.OutcomePaused && o != httpapi.OutcomeStartedDuring)) {
			t.Errorf("run %s started before the bulk pause answered but is %q in it", l.id, o)
		}
	}
	t.Logf("bulk pause: %v", res.Counts)
	if t.Failed() {
		t.FailNow()
	}
	again, err := keyed.Bulk(ctx, "pause", req)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(res)
	b, _ := json.Marshal(again)
	if string(a) != string(b) {
		t.Fatalf("the repeat with the same Idempotency-Key answered differently:\n%s\n%s", a, b)
	}
	evs := allEvents(t, p, data[0])
	if n := count(evs, statestore.RunPaused, ""); n != 1 {
		t.Fatalf("%d RunPaused in %s after the repeat, want 1", n, data[0])
	}
	var payload struct{ RequestedBy, Reason string }
	_ = json.Unmarshal(evs[eventIndex(evs, statestore.RunPaused, "", 0)].Payload, &payload)
	if payload.RequestedBy != "oncall-jane" || payload.Reason != "incident 9" {
		t.Fatalf("RunPaused by %q for %q", payload.RequestedBy, payload.Reason)
	}

	// pause --wait again, without a key: all already paused; it follows
	// the drains to the end, once the steps in flight may end.
	if err := os.WriteFile(barrier, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var wout lockedBuffer
	m := &sidecartest.Main{Stdout: &wout, Stderr: &wout}
	if code := m.Run(wctx, []string{"pause", "-l", "team=data", "--plan", pl.PlanID, "--reason", "incident 9", "--wait", "--server", server}); code != 0 {
		t.Fatalf("pause --wait: exit %d\n%s", code, wout.String())
	}
	if w := wout.String(); !strings.Contains(w, "already_paused") || !strings.Contains(w, "drained 210/210") {
		t.Fatalf("pause --wait printed:\n%s", w)
	}
	webRunning, err := listAll(ctx, p.client, url.Values{"planId": {pl.PlanID}, "labelSelector": {"team=web"}, "status": {"PAUSED"}})
	if err != nil || len(webRunning.Runs) != 0 {
		t.Fatalf("team=web runs paused: %+v %v", webRunning, err)
	}

	// The staggered resume, then kill -9: the scheduled part is carried out
	// by the restarted sidecar, each run at its time, once.
	paused := countPaused()
	res, err = p.client.Bulk(ctx, "resume", httpapi.BulkRequest{LabelSelector: "team=data", PlanID: pl.PlanID, Reason: "dependency back",
		RequestedBy: "oncall-jane", Batch: 100, IntervalSeconds: 4})
	if err != nil {
		t.Fatal(err)
	}
	p.stop(syscall.SIGKILL)
	if res.Counts[httpapi.OutcomeResumed] != 100 || res.Counts[httpapi.OutcomeScheduled] != paused-100 {
		t.Fatalf("staggered resume of %d: %v, want 100 resumed and the rest scheduled", paused, res.Counts)
	}
	due := map[string]time.Time{}
	for _, r := range res.Runs {
		if r.Outcome == httpapi.OutcomeScheduled {
			due[r.RunID], _ = time.Parse(time.RFC3339Nano, r.ResumeAt)
		}
	}
	time.Sleep(time.Second)
	p = startServe(t, dataDir, addr, "--concurrency", "command=16")
	sidecartest.WaitFor(t, "every run to be resumed", 60*time.Second, func() bool { return countPaused() == 0 })
	for id, at := range due {
		evs := allEvents(t, p, id)
		i := eventIndex(evs, statestore.RunResumed, "", 0)
		if n := count(evs, statestore.RunResumed, ""); n != 1 {
			t.Fatalf("run %s: %d RunResumed, want 1", id, n)
		}
		var pl struct{ RequestedBy, Reason string }
		_ = json.Unmarshal(evs[i].Payload, &pl)
		when, _ := time.Parse(time.RFC3339Nano, evs[i].PersistedAt)
		if pl.RequestedBy != "oncall-jane" || pl.Reason != "dependency back" || when.Before(at) {
			t.Fatalf("run %s resumed at %s by %q (%q), due %s", id, when, pl.RequestedBy, pl.Reason, at)
		}
	}
	t.Logf("staggered resume: %v; %d scheduled runs resumed by the restarted sidecar, each at or after its time", res.Counts, len(due))
}
