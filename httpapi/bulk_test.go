package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// startingControl pauses by appending RunPaused to the real log, and
// starts a new run matching the bulk's selector at some of its pauses:
// runs that start while a bulk action acts, on cue (TestE2E_BulkControl
// has the same race on the real Conductor, but not on cue).
type startingControl struct {
	recordingControl
	t      *testing.T
	store  *natsstore.Store
	mu     sync.Mutex
	starts func(runID string) []string // the runs to start when runID is paused
	pauses []drain.PauseRequest        // what each pause asked
}

func (c *startingControl) Pause(ctx context.Context, runID string, req drain.PauseRequest) (*drain.State, error) {
	c.append(storetest.Event(runID, statestore.RunPaused, ""))
	c.mu.Lock()
	c.pauses = append(c.pauses, req)
	next := c.starts(runID)
	c.mu.Unlock()
	for _, id := range next {
		c.start(id)
	}
	return c.record("pause", runID, req.RequestedBy, req.Reason)
}

func (c *startingControl) start(runID string) {
	w := storetest.Event(runID, statestore.RunStarted, "")
	c.append(storetest.WithPayload(w, map[string]any{"labels": map[string]string{"team": "data"}}))
}

func (c *startingControl) append(w *statestore.RunEventWrite) {
	if _, err := c.store.Append(context.Background(), w); err != nil {
		c.t.Error(err)
	}
}

func bulkEnv(t *testing.T, c *startingControl) *httptest.Server {
	store, list := openListedLog(t, natstest.Connect(t, natstestServer(t)))
	c.t, c.store = t, store
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, List: list, Control: c, Logger: zaptest.NewLogger(t)}).Handler())
	t.Cleanup(srv.Close)
	return srv
}

func postBulk(t *testing.T, srv *httptest.Server, action, body string) (int, httpapi.BulkResult, string) {
	t.Helper()
	resp, err := http.Post(srv.URL+"/v1/runs:"+action, "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	var res httpapi.BulkResult
	_ = json.Unmarshal(buf.Bytes(), &res)
	return resp.StatusCode, res, buf.String()
}

// TestBulk_RunsThatStartMeanwhile: a run that starts while a bulk pause
// acts is selected by the next round and paused; when runs keep starting,
// those after the last round are answered as started_during, never left
// out.
func TestBulk_RunsThatStartMeanwhile(t *testing.T) {
	c := &startingControl{}
	srv := bulkEnv(t, c)
	for i := range 4 {
		c.start(fmt.Sprintf("r%d", i))
	}
	c.starts = func(runID string) []string {
		if runID == "r0" {
			return []string{"late"}
		}
		return nil
	}
	status, res, raw := postBulk(t, srv, "pause", `{"labelSelector":"team=data","reason":"incident"}`)
	if status != 200 || res.Counts["paused"] != 5 || len(res.Runs) != 5 {
		t.Fatalf("%d %s: want the 4 runs and the one that started meanwhile paused", status, raw)
	}

	// Every pause starts another run: three rounds act, the runs of the
	// fourth are reported.
	c2 := &startingControl{}
	srv2 := bulkEnv(t, c2)
	c2.start("g0")
	n := 0
	c2.starts = func(string) []string { n++; return []string{fmt.Sprintf("g%d", n)} }
	status, res, raw = postBulk(t, srv2, "pause", `{"labelSelector":"team=data","reason":"incident"}`)
	var outcomes []string
	for _, r := range res.Runs {
		outcomes = append(outcomes, r.RunID+":"+r.Outcome)
	}
	sort.Strings(outcomes)
	want := []string{"g0:paused", "g1:paused", "g2:paused", "g3:started_during"}
	if status != 200 || fmt.Sprint(outcomes) != fmt.Sprint(want) {
		t.Fatalf("%d %s: got %v, want %v", status, raw, outcomes, want)
	}
}

// TestBulk_BadRequests: a bulk action without a reason, without a filter
// (unless all), with another action's fields, a bad selector or a bad
// stagger is refused and acts on nothing.
func TestBulk_BadRequests(t *testing.T) {
	c := &startingControl{starts: func(string) []string { return nil }}
	srv := bulkEnv(t, c)
	c.start("r0")
	for _, tc := range []struct{ action, body, code, field string }{
		{"pause", `{"labelSelector":"team=data"}`, "BAD_REQUEST", "reason"},
		{"pause", `{"reason":"x"}`, "BAD_REQUEST", "all"},
		{"pause", `{"all":"yes","reason":"x"}`, "BAD_REQUEST", ""},
		{"pause", `{"labelSelector":"tier in (gold","reason":"x"}`, "LABEL_SELECTOR_INVALID", "labelSelector"},
		{"pause", `{"labelSelector":"team=data","reason":"x","maxPerSecond":5}`, "BAD_REQUEST", "maxPerSecond"},
		{"resume", `{"labelSelector":"team=data","reason":"x","timeoutSeconds":5}`, "BAD_REQUEST", "timeoutSeconds"},
		{"resume", `{"labelSelector":"team=data","reason":"x","maxPerSecond":5,"batch":2,"intervalSeconds":1}`, "BAD_REQUEST", "maxPerSecond"},
		{"resume", `{"labelSelector":"team=data","reason":"x","batch":2}`, "BAD_REQUEST", "batch"},
		{"resume", `{"labelSelector":"team=data","reason":"x","maxPerSecond":-1}`, "BAD_REQUEST", "maxPerSecond"},
		{"cancel", `{"labelSelector":"team=data","reason":"x","dryRun":1}`, "BAD_REQUEST", ""},
	} {
		status, _, raw := postBulk(t, srv, tc.action, tc.body)
		var e struct{ Code, Field string }
		_ = json.Unmarshal([]byte(raw), &e)
		if status != 400 || e.Code != tc.code || (tc.field != "" && e.Field != tc.field) {
			t.Errorf("%s %s: %d %s, want 400 %s field %q", tc.action, tc.body, status, raw, tc.code, tc.field)
		}
	}
	if calls := c.taken(); len(calls) != 0 {
		t.Fatalf("refused bulk requests acted: %v", calls)
	}
	// all: true acts on every run; a dry run on none.
	if status, res, raw := postBulk(t, srv, "pause", `{"all":true,"reason":"x","dryRun":true}`); status != 200 || len(res.Runs) != 1 || res.Runs[0].Outcome != "would_act" || len(c.taken()) != 0 {
		t.Fatalf("dry run of all: %d %s, calls %v", status, raw, c.taken())
	}
	// A bulk pause carries the pause's fields to every run: drain timeout,
	// scheduled resume, reason, requestedBy.
	before := time.Now()
	if status, _, raw := postBulk(t, srv, "pause", `{"all":true,"reason":"night","requestedBy":"jane","timeoutSeconds":60,"resumeAfterSeconds":3600}`); status != 200 {
		t.Fatalf("bulk pause with a scheduled resume: %d %s", status, raw)
	}
	c.mu.Lock()
	got := c.pauses
	c.mu.Unlock()
	if len(got) != 1 || got[0].TimeoutSeconds != 60 || got[0].Reason != "night" || got[0].RequestedBy != "jane" ||
		got[0].ResumeAt.Before(before.Add(time.Hour)) || got[0].ResumeAt.After(time.Now().Add(time.Hour)) {
		t.Fatalf("the pause asked: %+v", got)
	}
}

// slowList is the real run list taking longer than the first selection's
// 10 s to catch up with what the action itself wrote (10,000 runs' events
// on a loaded machine): every wait after the first is held back by lag.
type slowList struct {
	httpapi.RunLister
	lag   time.Duration
	mu    sync.Mutex
	waits int
}

func (l *slowList) WaitIndexed(ctx context.Context) (uint64, error) {
	l.mu.Lock()
	l.waits++
	n := l.waits
	l.mu.Unlock()
	if n > 1 {
		select {
		case <-time.After(l.lag):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return l.RunLister.WaitIndexed(ctx)
}

// TestBulk_ListSlowAfterActing: once a bulk action has acted, its next
// selection (the runs that started meanwhile) waits for the run list to
// take in the action's own events however long that takes on a loaded
// machine, rather than failing the request with 503 after the runs were
// acted on and losing their outcomes.
func TestBulk_ListSlowAfterActing(t *testing.T) {
	c := &startingControl{starts: func(string) []string { return nil }}
	store, list := openListedLog(t, natstest.Connect(t, natstestServer(t)))
	c.t, c.store = t, store
	slow := &slowList{RunLister: list, lag: 12 * time.Second}
	srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, List: slow, Control: c, Logger: zaptest.NewLogger(t)}).Handler())
	t.Cleanup(srv.Close)
	for i := range 3 {
		c.start(fmt.Sprintf("r%d", i))
	}
	status, res, raw := postBulk(t, srv, "pause", `{"labelSelector":"team=data","reason":"incident"}`)
	if status != 200 || res.Counts["paused"] != 3 {
		t.Fatalf("%d %s: want the 3 runs paused", status, raw)
	}
}

// TestBulk_OnlyTheRunsNamed: with runIds (the runs a dry run listed), a
// bulk action acts on those of them the filter still selects and on no
// other, not on a run that began to match after the dry run; bad runIds
// are refused and nothing is done.
func TestBulk_OnlyTheRunsNamed(t *testing.T) {
	c := &startingControl{starts: func(string) []string { return nil }}
	srv := bulkEnv(t, c)
	for _, id := range []string{"a", "b", "late"} {
		c.start(id)
	}
	status, res, raw := postBulk(t, srv, "pause", `{"labelSelector":"team=data","reason":"incident","runIds":["a","b","gone"]}`)
	var got []string
	for _, r := range res.Runs {
		got = append(got, r.RunID+":"+r.Outcome)
	}
	sort.Strings(got)
	if status != 200 || fmt.Sprint(got) != "[a:paused b:paused]" {
		t.Fatalf("%d %s: got %v, want a and b paused, late untouched", status, raw, got)
	}
	for _, body := range []string{
		`{"labelSelector":"team=data","reason":"x","runIds":[]}`,
		`{"labelSelector":"team=data","reason":"x","runIds":["a|b"]}`,
		`{"labelSelector":"team=data","reason":"x","runIds":"a"}`,
	} {
		if status, _, raw := postBulk(t, srv, "pause", body); status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", body, status, raw)
		}
	}
	if n := len(c.pauses); n != 2 {
		t.Fatalf("%d pauses, want the 2 named", n)
	}
}

// TestBulk_LogUnreadable: a bulk action whose log cannot be read (the
// store down) answers the store's own code, not RUN_LIST_SYNCING, and says
// what it did: nothing before acting; after acting, how many runs it
// acted on, so that the caller knows a repeat finds them already done.
func TestBulk_LogUnreadable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		downFrom string // "request": before the request; "pause": after the first pause
		want     string
	}{
		{"BeforeActing", "request", "nothing was done"},
		{"AfterActing", "pause", "1 of the 1 runs selected were acted on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, srv := natstest.Start(t)
			store, list := openListedLog(t, natstest.Connect(t, srv))
			var once sync.Once
			c := &startingControl{t: t, store: store, starts: func(string) []string {
				if tc.downFrom == "pause" {
					once.Do(srv.Shutdown)
				}
				return nil
			}}
			api := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, List: list, Control: c, Logger: zaptest.NewLogger(t)}).Handler())
			t.Cleanup(api.Close)
			c.start("r1")
			if _, err := list.WaitIndexed(context.Background()); err != nil {
				t.Fatal(err)
			}
			if tc.downFrom == "request" {
				srv.Shutdown()
			}
			status, _, raw := postBulk(t, api, "pause", `{"labelSelector":"team=data","reason":"incident"}`)
			var e httpapi.Error
			_ = json.Unmarshal([]byte(raw), &e)
			if status != http.StatusServiceUnavailable || e.Code != statestore.CodeStoreUnavailable || !strings.Contains(e.Message, tc.want) || strings.Contains(e.Message, "did not catch up") {
				t.Fatalf("%d %s; want 503 %s saying %q", status, raw, statestore.CodeStoreUnavailable, tc.want)
			}
		})
	}
}

// TestBulk_DryRunNeedsNoReason: a dry run records nothing, so it needs no
// reason; the action itself does.
func TestBulk_DryRunNeedsNoReason(t *testing.T) {
	c := &startingControl{starts: func(string) []string { return nil }}
	srv := bulkEnv(t, c)
	c.start("r1")
	status, res, raw := postBulk(t, srv, "pause", `{"labelSelector":"team=data","dryRun":true}`)
	if status != 200 || res.Counts["would_act"] != 1 {
		t.Fatalf("dry run without a reason: %d %s, want 200 and the run it would pause", status, raw)
	}
	if status, _, raw := postBulk(t, srv, "pause", `{"labelSelector":"team=data"}`); status != 400 || !strings.Contains(raw, "needs a reason") {
		t.Fatalf("pause without a reason: %d %s, want 400", status, raw)
	}
}

// TestBulk_PauseNamesTheQueuedRuns: a bulk pause whose filter selects runs
// waiting for admission answers them as queued (they have no workflow to
// pause and start when capacity frees), in the dry run too: before, they
// were left out of the answer, and an operator who "paused" a class of
// runs saw one of them start RUNNING later.
func TestBulk_PauseNamesTheQueuedRuns(t *testing.T) {
	c := &startingControl{starts: func(string) []string { return nil }}
	srv := bulkEnv(t, c)
	c.start("r0")
	c.append(storetest.WithPayload(storetest.Event("q0", statestore.RunQueued, ""),
		map[string]any{"policy": "queue", "reason": "global limit 1", "labels": map[string]string{"team": "data"}}))
	for _, body := range []string{`{"labelSelector":"team=data","dryRun":true}`, `{"labelSelector":"team=data","reason":"incident"}`} {
		status, res, raw := postBulk(t, srv, "pause", body)
		got := map[string]string{}
		for _, r := range res.Runs {
			got[r.RunID] = r.Outcome
		}
		if status != 200 || got["q0"] != httpapi.OutcomeQueued || (got["r0"] != httpapi.OutcomePaused && got["r0"] != httpapi.OutcomeWould) {
			t.Fatalf("%s: %d %s: want r0 paused (or would_act) and q0 queued", body, status, raw)
		}
	}
}
