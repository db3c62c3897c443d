package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/e2e/sidecartest"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a reader at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// listAll reads every page of a listing: the runs of every page, with the
// first page's revision.
func listAll(ctx context.Context, client *httpapi.Client, q url.Values) (*httpapi.RunList, error) {
	var all *httpapi.RunList
	for all == nil || all.Continue != "" {
		if all != nil {
			q.Set("continue", all.Continue)
		}
		page, err := client.ListRuns(ctx, q)
		if err != nil {
			return nil, err
		}
		if all == nil {
			all = page
			continue
		}
		all.Runs, all.Continue = append(all.Runs, page.Runs...), page.Continue
	}
	return all, nil
}

// TestE2E_ListRuns: runs of two plans with labels, one of them paused
// while a step runs, are listed by plan, label selector, status and
// substatus, through the API and `sidecar runs` (with the plan's step
// count); `runs -w` prints the paused run again when it is resumed.
func TestE2E_ListRuns(t *testing.T) {
	p := startServe(t, t.TempDir(), sidecartest.FreeAddr(t))
	server := "http://" + p.addr
	ctx := context.Background()
	long := mustPlan(t, `{"planId":"`+uniq("e2e-list-long")+`","planVersion":"1","steps":[
		{"stepId":"wait","executor":{"type":"command","argv":["sleep","30"]}},
		{"stepId":"after","executor":{"type":"noop"},"dependsOn":["wait"]}]}`)
	short := mustPlan(t, `{"planId":"`+uniq("e2e-list-short")+`","planVersion":"1","steps":[{"stepId":"a","executor":{"type":"noop"}}]}`)
	start := func(pl any, labels map[string]string) string {
		t.Helper()
		req := httpapi.StartRequest{TenantID: "t-e2e", ProjectID: "p-e2e", EnvironmentID: "test", RunRequestID: uniq("req"), Labels: labels}
		req.Plan = long
		if pl != nil {
			req.Plan = short
		}
		s, err := p.client.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return s.RunID
	}
	gold1 := start(nil, map[string]string{"team": "data", "tier": "gold"})
	gold2 := start(nil, map[string]string{"team": "data", "tier": "gold"})
	silver := start(nil, map[string]string{"team": "data", "tier": "silver"})
	web := start(nil, map[string]string{"team": "web"})
	done1 := start(short, map[string]string{"team": "data", "tier": "gold"})
	done2 := start(short, nil)
	for _, id := range []string{done1, done2} {
		waitTerminal(t, p, id, 60*time.Second)
	}
	for _, id := range []string{gold1, gold2, silver, web} {
		sidecartest.WaitFor(t, "the step of "+id+" to start", 30*time.Second, func() bool {
			return eventIndex(allEvents(t, p, id), statestore.StepStarted, "wait", 0) >= 0
		})
	}
	defer func() {
		for _, id := range []string{gold1, gold2, silver, web} {
			_, _ = p.client.Cancel(ctx, id, "test over")
		}
	}()
	if _, err := p.client.Pause(ctx, gold1, 0, "incident 7"); err != nil {
		t.Fatal(err)
	}

	list := func(q url.Values) []string {
		t.Helper()
		page, err := p.client.ListRuns(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range page.Runs {
			ids = append(ids, r.RunID)
		}
		slices.Sort(ids)
		return ids
	}
	sorted := func(ids ...string) []string { slices.Sort(ids); return ids }
	sidecartest.WaitFor(t, "the list to show the pause", 10*time.Second, func() bool {
		return slices.Equal(list(url.Values{"substatus": {"DRAINING"}}), []string{gold1})
	})
	cases := []struct {
		q    url.Values
		want []string
	}{
		{url.Values{"planId": {long.PlanID}}, sorted(gold1, gold2, silver, web)},
		{url.Values{"planId": {long.PlanID}, "labelSelector": {"tier=gold"}}, sorted(gold1, gold2)},
		{url.Values{"labelSelector": {"tier=gold"}}, sorted(gold1, gold2, done1)},
		{url.Values{"labelSelector": {"team=data,tier!=gold"}}, sorted(silver)},
		{url.Values{"labelSelector": {"tier in (gold,silver)"}, "status": {"RUNNING"}}, sorted(gold2, silver)},
		{url.Values{"status": {"COMPLETED"}}, sorted(done1, done2)},
		{url.Values{"status": {"PAUSED,COMPLETED"}, "labelSelector": {"tier"}}, sorted(gold1, done1)},
		{url.Values{"tenantId": {"someone-else"}}, nil},
	}
	for _, c := range cases {
		if got := list(c.q); !slices.Equal(got, c.want) {
			t.Errorf("list %v: got %v, want %v", c.q, got, c.want)
		}
	}
	page, err := p.client.ListRuns(ctx, url.Values{"substatus": {"DRAINING"}})
	if err != nil || len(page.Runs) != 1 {
		t.Fatalf("%+v %v", page, err)
	}
	if r := page.Runs[0]; r.Status != "PAUSED" || r.InFlight != 1 || r.PauseReason != "incident 7" || r.Labels["tier"] != "gold" ||
		r.Steps != 1 || r.PlanSteps != 2 {
		t.Fatalf("the draining run's row: %+v", r)
	}
	for q, code := range map[string]string{"labelSelector=tier+in+(gold": "LABEL_SELECTOR_INVALID", "status=SLEEPING": "BAD_REQUEST",
		"continue=xyz": "CONTINUE_TOKEN_INVALID", "limit=0": "BAD_REQUEST"} {
		v, _ := url.ParseQuery(q)
		if _, err := p.client.ListRuns(ctx, v); err == nil || !strings.Contains(err.Error(), code) {
			t.Errorf("list ?%s: %v, want %s", q, err, code)
		}
	}

	// The CLI: a table (STEPS: done of the plan's 2 steps), wide, JSON,
	// and a bad selector.
	code, out, errOut := sidecartest.Run(t, "runs", "-l", "tier=gold", "--plan", long.PlanID, "--server", server)
	if code != 0 || !strings.Contains(out, "RUN") || !strings.Contains(out, gold1) || !strings.Contains(out, gold2) ||
		!strings.Contains(out, "PAUSED/DRAINING") || strings.Contains(out, silver) || !strings.Contains(out, " 0/2 ") {
		t.Fatalf("runs -l: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ = sidecartest.Run(t, "runs", "--draining", "-o", "wide", "--server", server); code != 0 || !strings.Contains(out, "incident 7") || !strings.Contains(out, "team=data,tier=gold") {
		t.Fatalf("runs -o wide: exit %d\n%s", code, out)
	}
	code, out, _ = sidecartest.Run(t, "runs", "--status", "COMPLETED", "-o", "json", "--server", server)
	var got httpapi.RunList
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got.Runs) != 2 {
		t.Fatalf("runs -o json: exit %d\n%s", code, out)
	}
	if code, _, errOut = sidecartest.Run(t, "runs", "-l", "tier in (gold", "--server", server); code == 0 || !strings.Contains(errOut, "LABEL_SELECTOR_INVALID") {
		t.Fatalf("bad selector: exit %d: %s", code, errOut)
	}

	// -w: the paused run comes back once resumed (it left --status PAUSED).
	var wout, werr lockedBuffer
	wctx, stop := context.WithCancel(ctx)
	ended := make(chan int)
	go func() {
		m := &sidecartest.Main{Stdout: &wout, Stderr: &werr}
		ended <- m.Run(wctx, []string{"runs", "--status", "PAUSED", "-w", "--server", server})
	}()
	sidecartest.WaitFor(t, "runs -w to list the paused run", 10*time.Second, func() bool { return strings.Contains(wout.String(), gold1) })
	if _, err := p.client.Resume(ctx, gold1); err != nil {
		t.Fatal(err)
	}
	sidecartest.WaitFor(t, "runs -w to print the resumed run", 15*time.Second, func() bool {
		return strings.Count(wout.String(), gold1) == 2 && strings.Contains(wout.String(), "RUNNING")
	})
	stop()
	if code := <-ended; code != 0 {
		t.Fatalf("runs -w ended with %d: %s", code, werr.String())
	}
}
