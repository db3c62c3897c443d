package runlist_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// fixture is a log on an embedded server with helpers to write runs.
type fixture struct {
	t     *testing.T
	js    jetstream.JetStream
	store *natsstore.Store
}

func newFixture(t *testing.T) *fixture {
	// An administrator's permissions: TestList_RebuiltFromTheLog deletes
	// the bucket, as an operator who lost it would have.
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: natsstore.AllPermissions})
	s, err := natsstore.Open(context.Background(), js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &fixture{t: t, js: js, store: s}
}

func (f *fixture) append(w *statestore.RunEventWrite) {
	f.t.Helper()
	if _, err := f.store.Append(context.Background(), w); err != nil {
		f.t.Fatal(err)
	}
}

// start appends a run's RunStarted with labels, in plan planID.
func (f *fixture) start(runID, planID string, labels map[string]string) {
	f.t.Helper()
	w := storetest.Event(runID, statestore.RunStarted, "")
	w.PlanID = planID
	storetest.Rekey(w)
	f.append(storetest.WithPayload(w, map[string]any{"engineType": "conductor", "labels": labels}))
}

func (f *fixture) event(runID, planID, typ, step string, attempt int64, payload any) {
	f.t.Helper()
	w := storetest.EventAt(runID, typ, step, attempt)
	w.PlanID = planID
	storetest.Rekey(w)
	if payload != nil {
		storetest.WithPayload(w, payload)
	}
	f.append(w)
}

func (f *fixture) open(opts runlist.Options) *runlist.List {
	f.t.Helper()
	opts.Log = f.store
	opts.Poll = 20 * time.Millisecond
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(f.t)
	}
	l, err := runlist.Open(context.Background(), f.js, opts)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func waitIndexed(t *testing.T, l *runlist.List) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := l.WaitIndexed(ctx); err != nil {
		t.Fatalf("WaitIndexed: %v", err)
	}
}

// truth is the row every run should have: from its snapshot as the
// projector computes it from the whole log.
func (f *fixture) truth(runID string) (status, substatus string, inFlight int, last int64) {
	f.t.Helper()
	recs, err := f.store.Fetch(context.Background(), runID, 0, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	snap, _ := statestore.Reduce(nil, recs)
	return snap.Status, snap.Substatus, len(snap.InFlight()), snap.LastEventSeq
}

// workload writes 40 runs of two plans: running, draining, paused,
// completed, failed and cancelled, with labels.
func (f *fixture) workload(prefix string) []string {
	var ids []string
	for i := range 40 {
		runID := fmt.Sprintf("%s-%02d", prefix, i)
		plan := "etl-nightly"
		if i%2 == 1 {
			plan = "report"
		}
		tier := []string{"gold", "silver", "bronze"}[i%3]
		f.start(runID, plan, map[string]string{"team": "data", "tier": tier})
		f.event(runID, plan, statestore.StepStarted, "a", 1, nil)
		switch i % 5 {
		case 1: // draining: paused with a step in flight
			f.event(runID, plan, statestore.RunPaused, "", 1, map[string]any{"reason": "incident 42", "requestedBy": "oncall"})
		case 2: // paused and drained
			f.event(runID, plan, statestore.StepCompleted, "a", 1, nil)
			f.event(runID, plan, statestore.RunPaused, "", 1, map[string]any{"reason": "incident 42", "requestedBy": "oncall"})
		case 3:
			f.event(runID, plan, statestore.StepCompleted, "a", 1, nil)
			f.event(runID, plan, statestore.RunCompleted, "", 1, nil)
		case 4:
			f.event(runID, plan, statestore.RunCancelRequested, "", 1, map[string]any{"reason": "no longer needed"})
			f.event(runID, plan, statestore.RunCancelled, "", 1, nil)
		}
		ids = append(ids, runID)
	}
	return ids
}

func allRows(t *testing.T, l *runlist.List, f runlist.Filter, limit int) []runlist.Row {
	t.Helper()
	var out []runlist.Row
	cont := ""
	for range 1000 {
		p, err := l.List(f, limit, cont)
		if err != nil {
			t.Fatal(err)
		}
		if limit > 0 && len(p.Runs) > limit {
			t.Fatalf("page of %d runs, limit %d", len(p.Runs), limit)
		}
		out = append(out, p.Runs...)
		if p.Continue == "" {
			return out
		}
		cont = p.Continue
	}
	t.Fatal("paging does not end")
	return nil
}

func (f *fixture) checkRows(l *runlist.List, ids []string) {
	f.t.Helper()
	rows := allRows(f.t, l, runlist.Filter{}, 0)
	byID := map[string]runlist.Row{}
	for _, r := range rows {
		byID[r.RunID] = r
	}
	for _, id := range ids {
		r, ok := byID[id]
		if !ok {
			f.t.Fatalf("run %s is not listed", id)
		}
		st, sub, inFlight, last := f.truth(id)
		if r.Status != st || r.Substatus != sub || r.InFlight != inFlight || r.LastEventSeq != last {
			f.t.Fatalf("run %s: listed %s/%s in flight %d through %d, the log says %s/%s %d through %d",
				id, r.Status, r.Substatus, r.InFlight, r.LastEventSeq, st, sub, inFlight, last)
		}
	}
}

func ids(rows []runlist.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.RunID
	}
	return out
}

// TestList_FiltersAndPages lists a workload by plan, status, substatus,
// scope and label selector, in pages that never repeat or skip a run.
func TestList_FiltersAndPages(t *testing.T) {
	f := newFixture(t)
	all := f.workload("run")
	l := f.open(runlist.Options{})
	waitIndexed(t, l)
	f.checkRows(l, all)

	sel := func(s string) runlist.Filter {
		t.Helper()
		p, err := runlist.ParseSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return runlist.Filter{Selector: p}
	}
	want := func(pred func(i int) bool) []string {
		var out []string
		for i, id := range all {
			if pred(i) {
				out = append(out, id)
			}
		}
		return out
	}
	cases := []struct {
		name   string
		filter runlist.Filter
		want   []string
	}{
		{"everything", runlist.Filter{}, all},
		{"plan", runlist.Filter{PlanID: "etl-nightly"}, want(func(i int) bool { return i%2 == 0 })},
		{"paused", runlist.Filter{Statuses: []string{"PAUSED"}}, want(func(i int) bool { return i%5 == 1 || i%5 == 2 })},
		{"draining", runlist.Filter{Substatus: "DRAINING"}, want(func(i int) bool { return i%5 == 1 })},
		{"two statuses", runlist.Filter{Statuses: []string{"COMPLETED", "CANCELLED"}}, want(func(i int) bool { return i%5 >= 3 })},
		{"tier=gold", sel("tier=gold"), want(func(i int) bool { return i%3 == 0 })},
		{"tier!=gold", sel("team=data,tier!=gold"), want(func(i int) bool { return i%3 != 0 })},
		{"tier in", sel("tier in (gold,silver)"), want(func(i int) bool { return i%3 != 2 })},
		{"no such label", sel("canary"), nil},
		{"not canary", sel("!canary"), all},
		{"tenant", runlist.Filter{TenantID: "tenant_acme"}, all},
		{"other tenant", runlist.Filter{TenantID: "tenant_other"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "plan+paused+gold" {
				return
			}
			for _, limit := range []int{0, 1, 7} {
				got := ids(allRows(t, l, c.filter, limit))
				wantSorted := slices.Clone(c.want)
				sort.Strings(wantSorted)
				gotSorted := slices.Clone(got)
				sort.Strings(gotSorted)
				if !slices.Equal(gotSorted, wantSorted) {
					t.Fatalf("limit %d: got %v, want %v", limit, got, c.want)
				}
			}
		})
	}
	// Newest first: the last run written comes first.
	rows := allRows(t, l, runlist.Filter{}, 0)
	if rows[0].RunID != all[len(all)-1] || rows[len(rows)-1].RunID != all[0] {
		t.Fatalf("order: first %s last %s, want newest (%s) first", rows[0].RunID, rows[len(rows)-1].RunID, all[len(all)-1])
	}
	for _, r := range rows {
		if r.RunID == all[1] && (r.PauseReason != "incident 42" || r.Labels["tier"] != "silver" || r.PlanID != "report" || r.Steps != 1 || r.Done != 0) {
			t.Fatalf("row of a draining run: %+v", r)
		}
	}

	if _, err := runlist.ParseSelector("tier in (gold"); !errorsIs(err, runlist.ErrSelectorInvalid) {
		t.Fatalf("bad selector: %v, want LABEL_SELECTOR_INVALID", err)
	}
	if _, err := l.List(runlist.Filter{}, 1, "garbage"); !errorsIs(err, runlist.ErrContinueInvalid) {
		t.Fatalf("bad continue token: %v, want CONTINUE_TOKEN_INVALID", err)
	}
}

// TestList_FollowsChanges: a run that drains, finishes draining and
// resumes is listed so at each step, and Changes reports each change.
func TestList_FollowsChanges(t *testing.T) {
	f := newFixture(t)
	l := f.open(runlist.Options{})
	f.start("r1", "p", map[string]string{"team": "data"})
	f.start("r2", "p", map[string]string{"team": "web"})
	f.event("r1", "p", statestore.StepStarted, "a", 1, nil)
	waitIndexed(t, l)
	page, err := l.List(runlist.Filter{}, 0, "")
	if err != nil || len(page.Runs) != 2 {
		t.Fatalf("list: %+v %v", page, err)
	}
	rev := page.Revision
	data, _ := runlist.ParseSelector("team=data")
	steps := []struct {
		typ, step string
		payload   any
		status    string
		substatus string
	}{
		{statestore.RunPaused, "", map[string]any{"reason": "r"}, "PAUSED", "DRAINING"},
		{statestore.StepCompleted, "a", nil, "PAUSED", ""},
		{statestore.RunResumed, "", map[string]any{"requestedBy": "oncall"}, "RUNNING", ""},
	}
	for _, s := range steps {
		f.event("r1", "p", s.typ, s.step, 1, s.payload)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ch, err := l.Changes(ctx, runlist.Filter{Selector: data, Statuses: []string{"PAUSED"}}, rev, 10*time.Second)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(ch.Runs) != 1 || ch.Runs[0].RunID != "r1" || ch.Runs[0].Status != s.status || ch.Runs[0].Substatus != s.substatus {
			t.Fatalf("after %s: changes %+v, want r1 %s/%s (a run leaving the status filter is reported too)", s.typ, ch.Runs, s.status, s.substatus)
		}
		// The list's pages show the change too (its sorted order is kept
		// between queries, and must not hold the old row).
		if p, err := l.List(runlist.Filter{Statuses: []string{s.status}, Substatus: s.substatus}, 0, ""); err != nil || !slices.Contains(ids(p.Runs), "r1") {
			t.Fatalf("after %s: listing %s/%s gives %+v %v, want r1", s.typ, s.status, s.substatus, p, err)
		}
		if ch.Revision <= rev {
			t.Fatalf("revision did not advance: %d -> %d", rev, ch.Revision)
		}
		rev = ch.Revision
	}
	// Nothing changed: Changes waits and returns nothing.
	began := time.Now()
	ch, err := l.Changes(context.Background(), runlist.Filter{}, rev, 200*time.Millisecond)
	if err != nil || len(ch.Runs) != 0 || time.Since(began) < 200*time.Millisecond {
		t.Fatalf("no change: %+v %v after %s", ch, err, time.Since(began))
	}
}

// TestList_RebuiltFromTheLog: with the bucket lost, a new list is built
// from the start of the log; with a list stopped mid-way, the next one
// reads back the runs it meets mid-log. Both give the log's truth.
func TestList_RebuiltFromTheLog(t *testing.T) {
	f := newFixture(t)
	first := f.workload("a")
	l := f.open(runlist.Options{Batch: 7})
	waitIndexed(t, l)
	l.Close(context.Background())

	// More events while no sidecar follows: runs started before the
	// cursor get events after it (read back), and new runs come.
	for i, id := range first {
		if i%5 == 0 {
			plan := map[bool]string{true: "etl-nightly", false: "report"}[i%2 == 0]
			f.event(id, plan, statestore.StepCompleted, "a", 1, nil)
			f.event(id, plan, statestore.RunFailed, "", 1, map[string]any{"error": map[string]any{"code": "X", "message": "boom"}})
		}
	}
	second := f.workload("b")
	l2 := f.open(runlist.Options{Batch: 7})
	waitIndexed(t, l2)
	f.checkRows(l2, append(slices.Clone(first), second...))
	l2.Close(context.Background())

	if err := f.js.DeleteKeyValue(context.Background(), runlist.DefaultBucket); err != nil {
		t.Fatal(err)
	}
	l3 := f.open(runlist.Options{Batch: 5})
	waitIndexed(t, l3)
	f.checkRows(l3, append(slices.Clone(first), second...))
}

// TestList_TwoFollowersAtOnce: two replicas that both believe they own the
// list (the membership fails open) write the same bucket; rows never go
// back and end equal to the log's.
func TestList_TwoFollowersAtOnce(t *testing.T) {
	f := newFixture(t)
	a := f.open(runlist.Options{Batch: 3})
	b := f.open(runlist.Options{Batch: 5})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 30 {
			f.start(fmt.Sprintf("c-%d", i), "p", nil)
		}
	}()
	all := f.workload("d")
	<-done
	for i := range 30 {
		all = append(all, fmt.Sprintf("c-%d", i))
	}
	waitIndexed(t, a)
	waitIndexed(t, b)
	f.checkRows(a, all)
	f.checkRows(b, all)
}

// TestList_OnlyTheOwnerFollows: a replica that does not own the list
// writes nothing; the owner's rows reach it through its mirror.
func TestList_OnlyTheOwnerFollows(t *testing.T) {
	f := newFixture(t)
	f.start("o1", "p", nil)
	notOwner := f.open(runlist.Options{Owner: owner(false)})
	time.Sleep(200 * time.Millisecond)
	if p, err := notOwner.List(runlist.Filter{}, 0, ""); err != nil || len(p.Runs) != 0 || p.IndexedThrough != 0 {
		t.Fatalf("a replica that does not own the list followed the log: %+v %v", p, err)
	}
	f.open(runlist.Options{Owner: owner(true)})
	waitIndexed(t, notOwner)
	f.checkRows(notOwner, []string{"o1"})
}

type owner bool

func (o owner) Owns(string) bool { return bool(o) }

// TestRow_JSON pins the row's field names: the API and `sidecar runs -o
// json` print rows as they are.
func TestRow_JSON(t *testing.T) {
	b, _ := json.Marshal(runlist.Row{RunID: "r", Status: "PAUSED", Substatus: "DRAINING", InFlight: 2, Labels: map[string]string{"a": "b"}})
	want := `{"runId":"r","tenantId":"","projectId":"","environmentId":"","planId":"","planVersion":"","labels":{"a":"b"},"status":"PAUSED","substatus":"DRAINING","steps":0,"done":0,"inFlight":2,"createdAt":"","lastEventSeq":0,"updatedAt":""}`
	if string(b) != want {
		t.Fatalf("row JSON:\n got %s\nwant %s", b, want)
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

// TestList_DrainETA: the follower records each step's duration per plan
// version; a DRAINING run's row (and List.ETA) estimates its drain's end
// from them, unknown for a step without history; the durations survive a
// rebuild of the list.
func TestList_DrainETA(t *testing.T) {
	f := newFixture(t)
	l := f.open(runlist.Options{})
	for i, ms := range []int{60, 120, 180} {
		id := fmt.Sprintf("done-%d", i)
		f.start(id, "p", nil)
		f.event(id, "p", statestore.StepStarted, "work", 1, nil)
		time.Sleep(time.Duration(ms) * time.Millisecond)
		f.event(id, "p", statestore.StepCompleted, "work", 1, nil)
		f.event(id, "p", statestore.RunCompleted, "", 1, nil)
	}
	f.start("draining", "p", nil)
	f.event("draining", "p", statestore.StepStarted, "work", 1, nil)
	f.event("draining", "p", statestore.StepStarted, "other", 1, nil)
	f.event("draining", "p", statestore.RunPaused, "", 1, map[string]any{"reason": "r"})
	waitIndexed(t, l)
	got := l.Durations("tenant_acme", "p", "2", "work")
	want := []float64{0.06, 0.12, 0.18}
	if len(got) != 3 {
		t.Fatalf("durations %v, want 3", got)
	}
	for i := range want {
		if got[i] < want[i] || got[i] > want[i]+0.1 {
			t.Fatalf("durations %v, want about %v", got, want)
		}
	}
	p, err := l.List(runlist.Filter{Substatus: statestore.SubstatusDraining}, 0, "")
	if err != nil || len(p.Runs) != 1 {
		t.Fatalf("%+v %v", p, err)
	}
	if e := p.Runs[0].DrainETA; e == nil || !slices.Equal(e.Unknown, []string{"other"}) || e.P50 != "" {
		t.Fatalf("ETA with a step without history: %+v, want unknown for other", e)
	}
	now := time.Now()
	e := l.ETA("tenant_acme", "p", "2", []runlist.InFlightStep{{StepID: "work", StartedAt: now.Format(time.RFC3339Nano)}}, now)
	p50, _ := time.Parse(time.RFC3339Nano, e.P50)
	p90, _ := time.Parse(time.RFC3339Nano, e.P90)
	if len(e.Unknown) != 0 || e.Samples != 3 || p50.Sub(now) < 110*time.Millisecond || p50.Sub(now) > 220*time.Millisecond || p90.Before(p50) {
		t.Fatalf("ETA of a step just started: %+v (p50 in %s), want about the median duration", e, p50.Sub(now))
	}
	l.Close(context.Background())

	if err := f.js.DeleteKeyValue(context.Background(), runlist.DefaultBucket); err != nil {
		t.Fatal(err)
	}
	rebuilt := f.open(runlist.Options{})
	waitIndexed(t, rebuilt)
	if again := rebuilt.Durations("tenant_acme", "p", "2", "work"); !slices.Equal(again, got) {
		t.Fatalf("after a rebuild: %v, want %v", again, got)
	}
}

// TestList_DrainETAIsEachTenants: the step durations a drain's estimate
// rests on are the run's tenant's own: another tenant's runs of the same
// plan version (plan ids are one namespace) neither shape it nor show
// through it (how often, and how long, that tenant ran the plan).
func TestList_DrainETAIsEachTenants(t *testing.T) {
	f := newFixture(t)
	l := f.open(runlist.Options{})
	other := func(w *statestore.RunEventWrite) *statestore.RunEventWrite {
		w.TenantID, w.PlanID = "tenant_other", "p"
		storetest.Rekey(w)
		return w
	}
	for i := range 3 {
		id := fmt.Sprintf("other-%d", i)
		f.append(storetest.WithPayload(other(storetest.Event(id, statestore.RunStarted, "")), map[string]any{"engineType": "conductor"}))
		f.append(other(storetest.EventAt(id, statestore.StepStarted, "work", 1)))
		time.Sleep(50 * time.Millisecond)
		f.append(other(storetest.EventAt(id, statestore.StepCompleted, "work", 1)))
		f.append(other(storetest.EventAt(id, statestore.RunCompleted, "", 1)))
	}
	f.start("draining", "p", nil)
	f.event("draining", "p", statestore.StepStarted, "work", 1, nil)
	f.event("draining", "p", statestore.RunPaused, "", 1, map[string]any{"reason": "r"})
	waitIndexed(t, l)
	p, err := l.List(runlist.Filter{Substatus: statestore.SubstatusDraining}, 0, "")
	if err != nil || len(p.Runs) != 1 {
		t.Fatalf("%+v %v", p, err)
	}
	if e := p.Runs[0].DrainETA; e == nil || !slices.Equal(e.Unknown, []string{"work"}) || e.Samples != 0 {
		t.Fatalf("the ETA of a tenant's first run of a plan another tenant ran 3 times: %+v, want unknown, no samples", e)
	}
}

// TestList_PausedByReason: sidecar_runs_paused_by_reason counts the PAUSED
// runs by where the pause came from (operator, step_failed, conductor), a
// bounded set: the free-text reason an operator typed is never a label
// value (every viewer reads /metrics, whatever its scope). A run resumed
// leaves it.
func TestList_PausedByReason(t *testing.T) {
	f := newFixture(t)
	reg := prometheus.NewRegistry()
	l := f.open(runlist.Options{Registerer: reg})
	pause := func(id string, payload map[string]any) {
		f.start(id, "p", nil)
		f.event(id, "p", statestore.RunPaused, "", 1, payload)
	}
	for i := range 3 {
		pause(fmt.Sprintf("db-%d", i), map[string]any{"reason": "db failover for tenant acme"})
	}
	pause("none", map[string]any{})
	for i := range 11 {
		pause(fmt.Sprintf("x-%d", i), map[string]any{"reason": fmt.Sprintf("reason %02d", i)})
	}
	pause("held", map[string]any{"reason": "stepFailed", "stepId": "a"})
	pause("ui", map[string]any{"reason": "paused in Conductor", "requestedBy": "conductor"})
	f.event("x-10", "p", statestore.RunResumed, "", 1, nil)
	waitIndexed(t, l)
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sidecar_runs_paused_by_reason" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{"operator": 14, "step_failed": 1, "conductor": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("by reason:\n got %v\nwant %v", got, want)
	}
}

// TestParseSelector_Bounded: a selector longer than MaxSelectorBytes or
// with more than MaxSelectorTerms terms is LABEL_SELECTOR_INVALID before
// it is parsed (20 concurrent 509 KB selectors once took 16 s each and
// 511 MB); one at the limits parses.
func TestParseSelector_Bounded(t *testing.T) {
	terms := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf("k%d=v", i)
		}
		return strings.Join(parts, ",")
	}
	for name, sel := range map[string]string{
		"Long":      "team in (" + strings.Repeat("a,", 250_000) + "b)",
		"JustOver":  "team=" + strings.Repeat("a", runlist.MaxSelectorBytes),
		"ManyTerms": terms(runlist.MaxSelectorTerms + 1),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := runlist.ParseSelector(sel)
			if !errorsIs(err, runlist.ErrSelectorInvalid) {
				t.Fatalf("a %d-byte selector: %v, want LABEL_SELECTOR_INVALID", len(sel), err)
			}
		})
	}
	if _, err := runlist.ParseSelector(terms(runlist.MaxSelectorTerms)); err != nil {
		t.Fatalf("%d terms: %v", runlist.MaxSelectorTerms, err)
	}
}

// stepCounter is a runlist.StepCounter of fixed answers that counts the
// lookups.
type stepCounter struct {
	mu    sync.Mutex
	steps map[string]int // "tenantId/planId" -> steps; absent: the plan cannot be read
	calls map[string]int
}

func (c *stepCounter) StepCount(_ context.Context, tenantID, planID, _ string) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := tenantID + "/" + planID
	c.calls[key]++
	n, ok := c.steps[key]
	if !ok {
		return 0, errors.New("no such workflow definition")
	}
	return n, nil
}

// TestList_PlanSteps: a listed row carries its plan's step count, so a
// paused 5-step run with 4 steps done reads 4 of 5 (not 4 of the 4 the
// log has seen); a plan that cannot be read leaves it 0 (unknown). Plans
// are immutable: each plan version is looked up once, by List and
// Changes alike. Plan ids are each tenant's: another tenant's plan of
// the same id and version has its own count.
func TestList_PlanSteps(t *testing.T) {
	f := newFixture(t)
	c := &stepCounter{steps: map[string]int{"tenant_acme/five": 5, "tenant_other/five": 3}, calls: map[string]int{}}
	l := f.open(runlist.Options{Plans: c})
	other := storetest.Event("other", statestore.RunStarted, "")
	other.TenantID, other.PlanID = "tenant_other", "five"
	storetest.Rekey(other)
	f.append(storetest.WithPayload(other, map[string]any{"engineType": "conductor"}))
	f.start("r5", "five", nil)
	for _, s := range []string{"a", "b", "c", "d"} {
		f.event("r5", "five", statestore.StepStarted, s, 1, nil)
		f.event("r5", "five", statestore.StepCompleted, s, 1, nil)
	}
	f.event("r5", "five", statestore.RunPaused, "", 1, map[string]any{"reason": "r"})
	f.start("lost", "gone", nil)
	f.event("lost", "gone", statestore.StepStarted, "a", 1, nil)
	waitIndexed(t, l)
	for range 2 {
		p, err := l.List(runlist.Filter{}, 0, "")
		if err != nil || len(p.Runs) != 3 {
			t.Fatalf("%+v %v", p, err)
		}
		for _, r := range p.Runs {
			want := map[string]int{"r5": 5, "lost": 0, "other": 3}[r.RunID]
			if r.PlanSteps != want || (r.RunID == "r5" && (r.Done != 4 || r.Steps != 4)) {
				t.Fatalf("row %s: done %d, steps %d, planSteps %d; want planSteps %d (r5: 4 done of 4 seen)", r.RunID, r.Done, r.Steps, r.PlanSteps, want)
			}
		}
	}
	ch, err := l.Changes(context.Background(), runlist.Filter{TenantID: "tenant_acme", PlanID: "five"}, 0, 0)
	if err != nil || len(ch.Runs) != 1 || ch.Runs[0].PlanSteps != 5 {
		t.Fatalf("changes: %+v %v, want r5 with planSteps 5", ch, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls["tenant_acme/five"] != 1 || c.calls["tenant_acme/gone"] != 1 || c.calls["tenant_other/five"] != 1 {
		t.Fatalf("lookups %v, want one per plan version (a failed one retried only later)", c.calls)
	}
}

// TestList_CoalescesRowWrites: while a run's events keep coming, its row
// is written once per Coalesce, not once per event (a row write is an
// fsynced JetStream write: 21-23 of them for a 10-step run), and the row
// still ends as the log says.
func TestList_CoalescesRowWrites(t *testing.T) {
	f := newFixture(t)
	reg := prometheus.NewRegistry()
	l := f.open(runlist.Options{Coalesce: 200 * time.Millisecond, Metrics: runlist.NewMetrics(reg)})
	f.start("r1", "p", nil)
	began := time.Now()
	for i := 1; i <= 10; i++ {
		step := fmt.Sprintf("s%d", i)
		f.event("r1", "p", statestore.StepStarted, step, 1, nil)
		time.Sleep(10 * time.Millisecond)
		f.event("r1", "p", statestore.StepCompleted, step, 1, nil)
		time.Sleep(10 * time.Millisecond)
	}
	f.event("r1", "p", statestore.RunCompleted, "", 1, nil)
	took := time.Since(began)
	waitIndexed(t, l)
	f.checkRows(l, []string{"r1"})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	writes := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "sidecar_runlist_row_writes_total" {
			writes = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	// One write per Coalesce while the events came, and one for the rest.
	if limit := float64(took/(200*time.Millisecond)) + 2; writes > limit {
		t.Errorf("%v row writes for 21 events in %s, want at most %v", writes, took.Round(time.Millisecond), limit)
	}
}

// TestList_WaitIndexedMeansAnswering: once WaitIndexed returns, the list
// answers (a bulk selection and a list watch rely on it), even on an empty
// log, where the cursor it waits for is 0 from the start.
func TestList_WaitIndexedMeansAnswering(t *testing.T) {
	for i := range 20 {
		f := newFixture(t)
		l := f.open(runlist.Options{})
		waitIndexed(t, l)
		if _, err := l.List(runlist.Filter{}, 10, ""); err != nil {
			t.Fatalf("open #%d: list right after WaitIndexed: %v", i, err)
		}
		if _, err := l.Changes(context.Background(), runlist.Filter{}, 0, 0); err != nil {
			t.Fatalf("open #%d: changes right after WaitIndexed: %v", i, err)
		}
	}
}

// TestList_DurationsOfAdoptedSteps: a step of an adopted run whose start
// and end were recorded from Conductor's report carries the engine's
// times; its duration is taken from them, not from the log's persistedAt
// (the same instant when both were recorded together), whether its two
// events are folded at once or its end comes in a later batch.
func TestList_DurationsOfAdoptedSteps(t *testing.T) {
	f := newFixture(t)
	l := f.open(runlist.Options{})
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) string { return t0.Add(d).Format(time.RFC3339Nano) }
	f.start("together", "adopted", nil)
	f.event("together", "adopted", statestore.StepStarted, "sys", 1, map[string]any{"engineStartedAt": at(0), "engineTaskId": "a"})
	f.event("together", "adopted", statestore.StepCompleted, "sys", 1, map[string]any{"engineEndedAt": at(5 * time.Second), "engineTaskId": "a"})
	waitIndexed(t, l)
	f.start("apart", "adopted", nil)
	f.event("apart", "adopted", statestore.StepStarted, "sys", 1, map[string]any{"engineStartedAt": at(time.Minute), "engineTaskId": "b"})
	waitIndexed(t, l) // its end in a later batch
	f.event("apart", "adopted", statestore.StepFailed, "sys", 1, map[string]any{"engineEndedAt": at(time.Minute + 7*time.Second), "engineTaskId": "b",
		"error": map[string]any{"code": "ENGINE_TASK_FAILED", "message": "m"}})
	waitIndexed(t, l)
	got := l.Durations("tenant_acme", "adopted", "2", "sys")
	if len(got) != 2 || got[0] < 4.99 || got[0] > 5.01 || got[1] < 6.99 || got[1] > 7.01 {
		t.Fatalf("durations %v, want [5 7] (the engine's times)", got)
	}
}

// TestList_DrainETAOfAStepAdoptedMidFlight: a worker task in progress
// when its workflow was adopted is recorded as started with Conductor's
// start time; the drain's estimate counts the time it has run from then,
// not from the adoption.
func TestList_DrainETAOfAStepAdoptedMidFlight(t *testing.T) {
	f := newFixture(t)
	l := f.open(runlist.Options{})
	t0 := time.Now().Add(-time.Hour)
	at := func(d time.Duration) string { return t0.Add(d).UTC().Format(time.RFC3339Nano) }
	for i := range 3 {
		id := fmt.Sprintf("earlier-%d", i)
		f.start(id, "adopted", nil)
		f.event(id, "adopted", statestore.StepStarted, "work", 1, map[string]any{"engineStartedAt": at(0)})
		f.event(id, "adopted", statestore.StepCompleted, "work", 1, map[string]any{"engineEndedAt": at(60 * time.Second)})
		f.event(id, "adopted", statestore.RunCompleted, "", 1, nil)
	}
	f.start("midflight", "adopted", nil)
	f.event("midflight", "adopted", statestore.StepStarted, "work", 1,
		map[string]any{"engineStartedAt": time.Now().Add(-50 * time.Second).UTC().Format(time.RFC3339Nano)})
	f.event("midflight", "adopted", statestore.RunPaused, "", 1, map[string]any{"reason": "r"})
	waitIndexed(t, l)
	p, err := l.List(runlist.Filter{Substatus: statestore.SubstatusDraining}, 0, "")
	if err != nil || len(p.Runs) != 1 || p.Runs[0].DrainETA == nil {
		t.Fatalf("%+v %v", p, err)
	}
	p50, _ := time.Parse(time.RFC3339Nano, p.Runs[0].DrainETA.P50)
	if left := time.Until(p50); left < 5*time.Second || left > 15*time.Second {
		t.Fatalf("the run list's ETA: drained in %s, want about 10s (60s steps, 50s run already)", left.Round(time.Second))
	}
	snap, err := f.store.ProjectSnapshot(context.Background(), "midflight")
	if err != nil {
		t.Fatal(err)
	}
	e := l.DrainETA(snap, time.Now()) // the run view's
	p50, _ = time.Parse(time.RFC3339Nano, e.P50)
	if left := time.Until(p50); left < 5*time.Second || left > 15*time.Second {
		t.Fatalf("the run view's ETA: drained in %s, want about 10s (60s steps, 50s run already)", left.Round(time.Second))
	}
}

// TestList_DurationsOfAStepThatWasIdle: a step whose try ended without an
// outcome (a restart handed it back, it sat out a pause) and ran again is
// recorded with the duration of the try that ended it, from its
// RunStepTryStarted, not with the time it sat idle; and a drain counts the
// time such a step has run from that try's start.
func TestList_DurationsOfAStepThatWasIdle(t *testing.T) {
	f := newFixture(t)
	l := f.open(runlist.Options{})
	f.start("idle", "plan", nil)
	f.event("idle", "plan", statestore.StepStarted, "work", 1, nil)
	f.event("idle", "plan", statestore.RunStepTryEnded, "", 1, map[string]any{"stepId": "work", "stepLogicalAttemptId": 1, "reason": statestore.TryEndedWorkerRestarted})
	time.Sleep(1500 * time.Millisecond) // idle
	f.event("idle", "plan", statestore.RunStepTryStarted, "", 2, map[string]any{"stepId": "work", "stepLogicalAttemptId": 1})
	snap, err := f.store.ProjectSnapshot(context.Background(), "idle")
	if err != nil {
		t.Fatal(err)
	}
	steps := runlist.InFlightSteps(snap)
	if len(steps) != 1 || steps[0].StartedAt == snap.Step("work").StartedAt {
		t.Fatalf("in flight %+v: want the step, its try's start (not StepStarted's, %s)", steps, snap.Step("work").StartedAt)
	}
	time.Sleep(200 * time.Millisecond) // the try runs
	f.event("idle", "plan", statestore.StepCompleted, "work", 1, nil)
	waitIndexed(t, l)
	// The recorded duration leaves out the idle 1.5 s at least, whatever
	// the appends took on a loaded machine.
	if snap, err = f.store.ProjectSnapshot(context.Background(), "idle"); err != nil {
		t.Fatal(err)
	}
	st := snap.Step("work")
	from, _ := time.Parse(time.RFC3339Nano, st.StartedAt)
	to, _ := time.Parse(time.RFC3339Nano, st.CompletedAt)
	if got := l.Durations("tenant_acme", "plan", "2", "work"); len(got) != 1 || got[0] > to.Sub(from).Seconds()-1.5 {
		t.Fatalf("durations %v, want one that leaves out the 1.5 s idle of the %.2f s since StepStarted", got, to.Sub(from).Seconds())
	}
}

// TestList_UpdatedSince: a filter on the time of a run's last event
// lists the runs touched since, however old they are (an action on an
// old run), and none other.
func TestList_UpdatedSince(t *testing.T) {
	f := newFixture(t)
	all := f.workload("run")
	l := f.open(runlist.Options{})
	waitIndexed(t, l)
	rows := allRows(t, l, runlist.Filter{}, 0)
	var newest time.Time
	for _, r := range rows {
		at, err := time.Parse(time.RFC3339Nano, r.UpdatedAt)
		if err != nil {
			t.Fatalf("row %s updatedAt %q: %v", r.RunID, r.UpdatedAt, err)
		}
		if at.After(newest) {
			newest = at
		}
	}
	since := newest.Add(time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	// The oldest paused run is resumed: the one run touched since.
	f.event(all[2], "etl-nightly", statestore.RunResumed, "", 1, map[string]any{"requestedBy": "oncall"})
	waitIndexed(t, l)
	for _, limit := range []int{0, 1, 3} {
		if got := ids(allRows(t, l, runlist.Filter{UpdatedSince: since}, limit)); !slices.Equal(got, []string{all[2]}) {
			t.Fatalf("limit %d: runs updated since the resume's eve: %v, want [%s]", limit, got, all[2])
		}
	}
	if got := allRows(t, l, runlist.Filter{UpdatedSince: time.Now().Add(time.Hour)}, 0); len(got) != 0 {
		t.Fatalf("runs updated in an hour: %v", ids(got))
	}
}
