package adapter

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestAdopter_SystemTasksUntilTheEnd: a workflow of system tasks only
// (HTTP to a local server, then INLINE), started in Conductor, is adopted
// (Ensure, as the workers' guard does) while its HTTP task runs; the
// adopter reads it back no more (its interval is an hour), so its tasks
// reach the log only because the watcher settles the run before it
// appends RunCompleted: they come before it, and the log is valid.
func TestAdopter_SystemTasksUntilTheEnd(t *testing.T) {
	u := conductortest.URL(t)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		time.Sleep(300 * time.Millisecond)
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	env := newNATS(t)
	runs := env.newRuns(t, u, RunsOptions{})
	ctx := context.Background()
	name := "adopt-system-" + suffix(t)
	def := `{"name":"` + name + `","version":1,"schemaVersion":2,"ownerEmail":"t@example.com","tasks":[
		{"name":"notify","taskReferenceName":"notify","type":"HTTP","inputParameters":{"http_request":{"uri":"` + srv.URL + `","method":"GET"}}},
		{"name":"calc","taskReferenceName":"calc","type":"INLINE","inputParameters":{"evaluatorType":"javascript","expression":"1 + 1"}}]}`
	if err := runs.conductor.RegisterWorkflowDefJSON(ctx, []byte(def)); err != nil {
		t.Fatal(err)
	}
	adopter := NewAdopter(runs, env.store, AdopterOptions{Specs: []AdoptSpec{{Name: name}}, Interval: time.Hour, Logger: zaptest.NewLogger(t)})
	watcher := NewWatcher(runs, env.store, WatcherOptions{Interval: 5 * time.Second, Adopted: adopter, Logger: zaptest.NewLogger(t)})
	if err := watcher.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watcher.Close(ctx) })
	if err := adopter.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adopter.Close(ctx) })
	id, err := runs.conductor.StartWorkflow(ctx, model.StartWorkflowRequest{Name: name, Version: 1, CorrelationId: "order-7",
		Input: map[string]any{"labels": map[string]any{"team": "data", "bad label": "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := adopter.Ensure(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(typesOf(env.events(t, id)), " "); got != "RunStarted" && got != "RunStarted StepStarted:notify" {
		t.Fatalf("at adoption, with the HTTP task scheduled or running: %s", got)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		// The watcher's own scan is slow here (5 s): nudge it as the
		// workers' reports do.
		watcher.Nudge(id)
		recs := env.events(t, id)
		if n := len(recs); n > 0 && statestore.IsTerminalRunStatus(mustReduce(t, recs).Status) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run not ended: %v", typesOf(recs))
		}
		time.Sleep(200 * time.Millisecond)
	}
	recs := env.events(t, id)
	want := "RunStarted StepStarted:notify StepCompleted:notify StepStarted:calc StepCompleted:calc RunCompleted"
	if got := strings.Join(typesOf(recs), " "); got != want {
		t.Fatalf("log %q\nwant %q", got, want)
	}
	if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
		t.Fatalf("alerts %+v", alerts)
	}
	if p := string(recs[0].Payload); !strings.Contains(p, `"correlationId":"order-7"`) || !strings.Contains(p, `"team":"data"`) || strings.Contains(p, "bad label") {
		t.Fatalf("RunStarted payload %s", p)
	}
	if recs[0].PlanID != name || recs[0].PlanVersion != "1" || recs[0].TenantID != "default" {
		t.Fatalf("RunStarted %+v", recs[0])
	}
	rec, err := runs.Run(ctx, id)
	if err != nil || !rec.IsAdopted() || rec.State != RunStateFinal {
		t.Fatalf("run index entry %+v, %v", rec, err)
	}

	// Restarted in Conductor after its run ended: a task of it polled
	// through the proxy adopts nothing again (a run ends once), and the
	// adopter does not follow the ended run (no reads for it).
	req, _ := http.NewRequest(http.MethodPost, u+"/workflow/"+id+"/restart", nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode >= 300 {
		t.Fatalf("restart in Conductor: %s", res.Status)
	}
	t.Cleanup(func() { _ = runs.conductor.Terminate(context.Background(), id, "test done") })
	if err := adopter.Ensure(ctx, id); err != nil {
		t.Fatal(err)
	}
	adopter.mu.Lock()
	_, followed := adopter.known[id]
	adopter.mu.Unlock()
	if followed {
		t.Fatal("the adopter follows the ended run of a workflow restarted in Conductor")
	}
	if got := strings.Join(typesOf(env.events(t, id)), " "); got != want {
		t.Fatalf("the ended run's log changed: %q", got)
	}
}

// TestAdopter_TaskDomain: with a task domain set, the adopter adopts the
// workflows of the adopted definition started in that domain only:
// found in the running list, by Ensure or by a polled task (Step); a
// workflow of another domain, or of none, is left to whoever adopts it.
func TestAdopter_TaskDomain(t *testing.T) {
	u := conductortest.URL(t)
	env := newNATS(t)
	runs := env.newRuns(t, u, RunsOptions{})
	ctx := context.Background()
	name := "adopt-domain-" + suffix(t)
	def := `{"name":"` + name + `","version":1,"schemaVersion":2,"ownerEmail":"t@example.com","tasks":[
		{"name":"` + name + `_w","taskReferenceName":"w","type":"SIMPLE"}]}`
	if err := runs.conductor.RegisterWorkflowDefJSON(ctx, []byte(def)); err != nil {
		t.Fatal(err)
	}
	domains := map[string]map[string]string{"ours": {"*": "d1"}, "byTask": {name + "_w": "d1"}, "theirs": {"*": "d2"}, "none": nil}
	ids := map[string]string{}
	for k, d := range domains {
		id, err := runs.conductor.StartWorkflow(ctx, model.StartWorkflowRequest{Name: name, Version: 1, TaskToDomain: d, Input: map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = runs.conductor.Terminate(context.Background(), id, "test done") })
		ids[k] = id
	}
	adopter := NewAdopter(runs, env.store, AdopterOptions{Specs: []AdoptSpec{{Name: name}}, TaskDomain: "d1",
		Interval: 50 * time.Millisecond, DiscoverEvery: 1, Logger: zaptest.NewLogger(t)})
	if err := adopter.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adopter.Close(ctx) })
	deadline := time.Now().Add(30 * time.Second)
	for len(env.events(t, ids["ours"])) == 0 || len(env.events(t, ids["byTask"])) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the workflows of the adopted domain were not adopted from the running list")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // ten more running-list reads
	for _, k := range []string{"theirs", "none"} {
		if n := len(env.events(t, ids[k])); n != 0 {
			t.Fatalf("the workflow of task domain %v was adopted: %d events", domains[k], n)
		}
		if err := adopter.Ensure(ctx, ids[k]); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Ensure of the workflow of task domain %v: %v, want not found", domains[k], err)
		}
	}
	// A task polled first (no running-list read or Ensure before it), on
	// a replica that has seen none of them.
	fresh := NewAdopter(runs, env.store, AdopterOptions{Specs: []AdoptSpec{{Name: name}}, TaskDomain: "d1", Logger: zaptest.NewLogger(t)})
	for k, id := range ids {
		wf, err := runs.conductor.WorkflowTasks(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range wf.Tasks {
			tk.WorkflowType = name
			if _, ok := fresh.Step(&tk); ok != (k == "ours" || k == "byTask") {
				t.Fatalf("a task of the workflow of task domain %v taken as an adopted run's: %v", domains[k], ok)
			}
		}
	}
}

func TestInTaskDomain(t *testing.T) {
	for _, c := range []struct {
		m      map[string]string
		domain string
		want   bool
	}{
		{nil, "", true},
		{map[string]string{"*": "x"}, "", true},
		{nil, "d", false},
		{map[string]string{"*": "d"}, "d", true},
		{map[string]string{"*": "e", "t": "d"}, "d", false},
		{map[string]string{"t": "d", "u": "d"}, "d", true},
		{map[string]string{"t": "d", "u": "e"}, "d", false},
		{map[string]string{"*": " d "}, "d", true},
		{map[string]string{"*": "d,e"}, "d", false},
	} {
		if got := InTaskDomain(c.m, c.domain); got != c.want {
			t.Errorf("InTaskDomain(%v, %q) = %v, want %v", c.m, c.domain, got, c.want)
		}
	}
}

func mustReduce(t *testing.T, recs []statestore.RunEventRecord) *statestore.RunSnapshot {
	t.Helper()
	s, _ := statestore.Reduce(nil, recs)
	return s
}

func typesOf(recs []statestore.RunEventRecord) []string {
	var out []string
	for _, r := range recs {
		s := r.EventType
		if r.StepID != "" {
			s += ":" + r.StepID
		}
		out = append(out, s)
	}
	return out
}

// ownsNothing is the Owner of a replica that owns none of the runs.
type ownsNothing struct{}

func (ownsNothing) Owns(string) bool { return false }

// TestAdopter_ResumeOnAReplicaThatDoesNotFollowTheRun: a resume of an
// adopted run reaches Conductor through a replica that does not follow the
// run (another replica owns it); Conductor schedules the run's HTTP task
// as it resumes. That replica reads the run and follows it until the task
// ends: the HTTP task is in the log while its call runs, and its end once
// the call returns, without any other replica's read; then it forgets the
// run, which its owner follows.
func TestAdopter_ResumeOnAReplicaThatDoesNotFollowTheRun(t *testing.T) {
	u := conductortest.URL(t)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		<-release
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	defer close(release)
	env := newNATS(t)
	runs := env.newRuns(t, u, RunsOptions{})
	ctx := context.Background()
	name := "adopt-resume-elsewhere-" + suffix(t)
	def := `{"name":"` + name + `","version":1,"schemaVersion":2,"ownerEmail":"t@example.com","tasks":[
		{"name":"hold","taskReferenceName":"hold","type":"WAIT","inputParameters":{"duration":"1 hour"}},
		{"name":"call","taskReferenceName":"call","type":"HTTP","inputParameters":{"http_request":{"uri":"` + srv.URL + `","method":"GET","readTimeOut":60000}}}]}`
	if err := runs.conductor.RegisterWorkflowDefJSON(ctx, []byte(def)); err != nil {
		t.Fatal(err)
	}
	id, err := runs.conductor.StartWorkflow(ctx, model.StartWorkflowRequest{Name: name, Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = runs.conductor.Terminate(context.Background(), id, "test done") })
	// The owner adopted the run; it reads nothing more here.
	owner := NewAdopter(runs, env.store, AdopterOptions{Specs: []AdoptSpec{{Name: name}}, Interval: time.Hour, Logger: zaptest.NewLogger(t)})
	if err := owner.Ensure(ctx, id); err != nil {
		t.Fatal(err)
	}
	other := NewAdopter(runs, env.store, AdopterOptions{Specs: []AdoptSpec{{Name: name}}, Interval: 200 * time.Millisecond,
		Owner: ownsNothing{}, Logger: zaptest.NewLogger(t)})
	if err := other.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close(ctx) })

	// Paused in Conductor, its WAIT completed meanwhile (Conductor
	// schedules nothing while paused), then resumed through the other
	// replica: Conductor schedules the HTTP task.
	if err := runs.conductor.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	wf, err := runs.conductor.Workflow(ctx, id, true)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"workflowInstanceId":"` + id + `","taskId":"` + wf.Tasks[0].TaskId + `","status":"COMPLETED"}`
	res, err := http.Post(u+"/tasks", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	req, _ := http.NewRequest(http.MethodPut, u+"/workflow/"+id+"/resume", nil)
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	other.Resumed(id)

	waitLog := func(what, want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(strings.Join(typesOf(env.events(t, id)), " "), want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: log %v, want %s in it", what, typesOf(env.events(t, id)), want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitLog("while the call runs", "StepStarted:call")
	release <- struct{}{}
	waitLog("after the call returned", "StepCompleted:call")
	// Nothing of it left to record: the run is its owner's to follow.
	deadline := time.Now().Add(10 * time.Second)
	for {
		other.mu.Lock()
		_, followed := other.known[id]
		other.mu.Unlock()
		if !followed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica that does not own the run still follows it with nothing left to record")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWatcher_ChildOfACancelledParentEndsCancelled: an adopted parent's
// run is cancelled (RunCancelRequested, then Conductor's terminate, which
// terminates its sub-workflow too); the adopted child's run ends
// RunCancelled naming who requested the parent's cancel, not RunFailed: no
// failure of the child's happened. A child terminated in Conductor
// otherwise still ends RunFailed WORKFLOW_TERMINATED.
func TestWatcher_ChildOfACancelledParentEndsCancelled(t *testing.T) {
	u := conductortest.URL(t)
	env := newNATS(t)
	runs := env.newRuns(t, u, RunsOptions{})
	ctx := context.Background()
	child := "adopt-cancel-child-" + suffix(t)
	parent := "adopt-cancel-parent-" + suffix(t)
	for _, def := range []string{
		`{"name":"` + child + `","version":1,"schemaVersion":2,"ownerEmail":"t@example.com","tasks":[
			{"name":"hold","taskReferenceName":"hold","type":"WAIT","inputParameters":{"duration":"1 hour"}}]}`,
		`{"name":"` + parent + `","version":1,"schemaVersion":2,"ownerEmail":"t@example.com","tasks":[
			{"name":"sub","taskReferenceName":"sub","type":"SUB_WORKFLOW","subWorkflowParam":{"name":"` + child + `","version":1}}]}`,
	} {
		if err := runs.conductor.RegisterWorkflowDefJSON(ctx, []byte(def)); err != nil {
			t.Fatal(err)
		}
	}
	adopter := NewAdopter(runs, env.store, AdopterOptions{Specs: []AdoptSpec{{Name: parent}, {Name: child}}, Interval: time.Hour, Logger: zaptest.NewLogger(t)})
	watcher := NewWatcher(runs, env.store, WatcherOptions{Interval: time.Hour, Adopted: adopter, Logger: zaptest.NewLogger(t)})
	if err := watcher.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watcher.Close(ctx) })
	start := func() (parentID, childID string) {
		t.Helper()
		parentID, err := runs.conductor.StartWorkflow(ctx, model.StartWorkflowRequest{Name: parent, Version: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = runs.conductor.Terminate(context.Background(), parentID, "test done") })
		deadline := time.Now().Add(30 * time.Second)
		for childID == "" {
			wf, err := runs.conductor.Workflow(ctx, parentID, true)
			if err != nil {
				t.Fatal(err)
			}
			for _, task := range wf.Tasks {
				childID = task.SubWorkflowId
			}
			if time.Now().After(deadline) {
				t.Fatal("Conductor did not start the sub-workflow")
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, id := range []string{parentID, childID} {
			if err := adopter.Ensure(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		return parentID, childID
	}
	end := func(childID string) statestore.RunEventRecord {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			watcher.Nudge(childID)
			recs := env.events(t, childID)
			if last := recs[len(recs)-1]; statestore.IsTerminalRunStatus(mustReduce(t, recs).Status) {
				return last
			}
			if time.Now().After(deadline) {
				t.Fatalf("child's run not ended: %v", typesOf(recs))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	parentID, childID := start()
	rec, err := runs.Run(ctx, parentID)
	if err != nil {
		t.Fatal(err)
	}
	req, err := runEvent(rec, statestore.RunCancelRequested, statestore.RunCancelRequestedPayload{Reason: "wrong order", RequestedBy: "acme-op"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.emitter.Emit(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := runs.conductor.Terminate(ctx, parentID, "wrong order"); err != nil {
		t.Fatal(err)
	}
	if last := end(childID); last.EventType != statestore.RunCancelled || !strings.Contains(string(last.Payload), `"requestedBy":"acme-op"`) {
		t.Fatalf("child of a cancelled parent ended %s %s, want RunCancelled requested by acme-op", last.EventType, last.Payload)
	}

	// The parent terminated in Conductor, no cancel requested: the
	// child's run fails, as any workflow terminated there.
	parentID, childID = start()
	if err := runs.conductor.Terminate(ctx, parentID, "done by hand"); err != nil {
		t.Fatal(err)
	}
	if last := end(childID); last.EventType != statestore.RunFailed || !strings.Contains(string(last.Payload), CodeWorkflowTerminated) {
		t.Fatalf("child of a parent terminated in Conductor ended %s %s, want RunFailed %s", last.EventType, last.Payload, CodeWorkflowTerminated)
	}
}
