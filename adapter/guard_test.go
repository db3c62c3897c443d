package adapter

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// pauseAfterClose is the watcher's view of the log (the real store), with
// an operator's pause landing right after the watcher closed a pause that
// raced the run's completion: the interleaving in which RunCompleted, the
// next event the watcher decided on, is no longer valid (PAUSED again).
type pauseAfterClose struct {
	t    *testing.T
	env  *natsEnv
	run  Run
	once sync.Once
}

func (p *pauseAfterClose) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := p.env.store.ProjectSnapshot(ctx, runID)
	if err != nil || runID != p.run.RunID || snap.Pause == nil || snap.Pause.Cycle != 1 || snap.Status != statestore.RunStatusRunning {
		return snap, err
	}
	p.once.Do(func() {
		ev, err := runEventAt(&p.run, statestore.RunPaused, 2, map[string]any{"drainTimeoutSeconds": 300, "requestedBy": "operator"})
		if err == nil {
			_, err = p.env.emitter.Emit(ctx, ev)
		}
		if err != nil {
			p.t.Errorf("the operator's pause: %v", err)
		}
	})
	return p.env.store.ProjectSnapshot(ctx, runID)
}

// TestWatcher_TerminalEventGuard: the watcher checks its terminal event
// against the run's state read just before the append (Layer 1) and never
// appends one the projector would flag. Here a pause lands between the
// RunResumed that closes a pause raced by Conductor's completion and the
// RunCompleted: the guard refuses RunCompleted (PAUSED), the watcher
// closes the new pause too and completes the run. Without the guard the
// log gets RunCompleted on PAUSED.
func TestWatcher_TerminalEventGuard(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, u, RunsOptions{})
	p := testPlan(t)
	res, err := r.StartRun(ctx, request(p, "req"))
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	snaps := &pauseAfterClose{t: t, env: env, run: run}
	pauses, _ := env.pauses(t, r, snaps, 0)
	w := NewWatcher(r, snaps, WatcherOptions{Interval: time.Hour, Pauses: pauses, Logger: zaptest.NewLogger(t)})
	recs := pauseThenComplete(t, env, r, w, run)
	if got, want := strings.Join(eventTypes(recs), " "), "RunStarted RunPaused RunResumed RunPaused RunResumed RunCompleted"; got != want {
		t.Fatalf("log %s, want %s", got, want)
	}
}

// pauseAfterEveryClose is pauseAfterClose with a new pause landing after
// every RunResumed the watcher appends: no number of closes cures it.
type pauseAfterEveryClose struct {
	t      *testing.T
	env    *natsEnv
	run    Run
	mu     sync.Mutex
	landed int64 // the last cycle this reader paused
}

func (p *pauseAfterEveryClose) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	snap, err := p.env.store.ProjectSnapshot(ctx, runID)
	if err != nil || runID != p.run.RunID || snap.Pause == nil || snap.Status != statestore.RunStatusRunning {
		return snap, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if next := snap.Pause.Cycle + 1; next > p.landed {
		ev, err := runEventAt(&p.run, statestore.RunPaused, next, map[string]any{"drainTimeoutSeconds": 300, "requestedBy": "operator"})
		if err == nil {
			_, err = p.env.emitter.Emit(ctx, ev)
		}
		if err != nil {
			p.t.Errorf("the operator's pause %d: %v", next, err)
		}
		p.landed = next
	}
	return p.env.store.ProjectSnapshot(ctx, runID)
}

// TestWatcher_TerminalRefusedIsCounted: when closing pauses cannot make
// the run's terminal event valid (a pause lands after every close), the
// watcher appends no terminal event, marks the run final and counts it as
// sidecar_run_watcher_actions_total{action="terminal_refused"}, the only
// trace of a Conductor end the log does not record.
func TestWatcher_TerminalRefusedIsCounted(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t)
	r := env.newRuns(t, u, RunsOptions{})
	res, err := r.StartRun(ctx, request(testPlan(t), "req"))
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	m := NewMetrics(prometheus.NewRegistry())
	snaps := &pauseAfterEveryClose{t: t, env: env, run: run, landed: 1}
	pauses, _ := env.pauses(t, r, snaps, 0)
	w := NewWatcher(r, snaps, WatcherOptions{Interval: time.Hour, Pauses: pauses, Logger: zaptest.NewLogger(t), Metrics: m})
	recs := pauseThenComplete(t, env, r, w, run)
	if last := recs[len(recs)-1].EventType; last != statestore.RunPaused {
		t.Fatalf("log %s, want it to end in the last pause (no terminal event)", strings.Join(eventTypes(recs), " "))
	}
	if n := testutil.ToFloat64(m.actions[actionTerminalRefused]); n != 1 {
		t.Fatalf("terminal_refused %v, want 1 (log %s)", n, strings.Join(eventTypes(recs), " "))
	}
}

// pauseThenComplete records a pause of run, completes its task in
// Conductor so the workflow ends while the log says PAUSED, lets w scan,
// and returns the run's final log, which must raise no alert.
func pauseThenComplete(t *testing.T, env *natsEnv, r *Runs, w *Watcher, run Run) []statestore.RunEventRecord {
	t.Helper()
	ctx := context.Background()
	paused, err := runEventAt(&run, statestore.RunPaused, 1, map[string]any{"drainTimeoutSeconds": 300, "requestedBy": "test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.emitter.Emit(ctx, paused); err != nil {
		t.Fatal(err)
	}
	task := pollTask(t, r.Client(), plan.TaskTypeNoop, run.TaskDomain)
	if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: run.WorkflowID, Status: model.CompletedTask}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, r.Client(), run.WorkflowID, model.CompletedWorkflow)
	if err := w.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	recs := waitFinal(t, env, r, run.RunID)
	if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
		t.Fatalf("the watcher appended an event the projector flags: %s (log %s)", alerts[0].Reason, strings.Join(eventTypes(recs), " "))
	}
	return recs
}

// pauseBeforeEnd is the append authority (the real store) with an
// operator's pause landing just before the run's terminal event: the
// first RunCompleted of run is preceded by a RunPaused (cycle 1) appended
// on the inner store, after the watcher read the run as RUNNING and
// decided on it. It is the interleaving no real timing can be made to
// hit on demand.
type pauseBeforeEnd struct {
	registry.Appender
	t    *testing.T
	run  Run
	once sync.Once
}

func (p *pauseBeforeEnd) pause(ctx context.Context, w *statestore.RunEventWrite) {
	if w.RunID != p.run.RunID || w.EventType != statestore.RunCompleted {
		return
	}
	p.once.Do(func() {
		ev, err := runEventAt(&p.run, statestore.RunPaused, 1, map[string]any{"drainTimeoutSeconds": 300, "requestedBy": "operator"})
		if err == nil {
			ev.EventID = uuid.NewString()
			_, err = p.Appender.Append(ctx, ev)
		}
		if err != nil {
			p.t.Errorf("the operator's pause: %v", err)
		}
	})
}

func (p *pauseBeforeEnd) Append(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	p.pause(ctx, w)
	return p.Appender.Append(ctx, w)
}

func (p *pauseBeforeEnd) AppendIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	p.pause(ctx, w)
	return p.Appender.AppendIf(ctx, w, lastSeq)
}

// TestWatcher_PauseBeforeTerminalEvent: a pause that lands after the
// watcher decided the run's end and before its RunCompleted is appended
// does not change the run's outcome. The terminal event is appended only
// on the state it was decided on (statestore.Fenced); the pause makes it
// decide again, the pause follower closes the pause (Conductor had
// COMPLETED the workflow) and the run ends COMPLETED, with a valid log.
// Over the plain store (RunCompleted would land on PAUSED) and over one
// that validates transitions (RunCompleted would be refused and the run
// marked final without its end).
func TestWatcher_PauseBeforeTerminalEvent(t *testing.T) {
	u := conductortest.URL(t)
	for _, validate := range []bool{false, true} {
		t.Run(map[bool]string{false: "Store", true: "ValidatingStore"}[validate], func(t *testing.T) {
			ctx := context.Background()
			env := newNATS(t)
			var app registry.Appender = env.store
			if validate {
				v, err := statestore.NewValidatingStore(env.store)
				if err != nil {
					t.Fatal(err)
				}
				app = v
			}
			reg, err := registry.Open(ctx, env.js, registry.Options{})
			if err != nil {
				t.Fatal(err)
			}
			hooked := &pauseBeforeEnd{Appender: app, t: t}
			wenv := *env
			wenv.emitter = registry.NewEmitter(reg, hooked)
			r := wenv.newRuns(t, u, RunsOptions{})
			p := testPlan(t)
			if err := r.RegisterPlan(ctx, "tenant-a", p); err != nil {
				t.Fatal(err)
			}
			res, err := r.StartRun(ctx, request(p, "req"))
			if err != nil {
				t.Fatal(err)
			}
			hooked.run = res.Run
			m := NewMetrics(prometheus.NewRegistry())
			pauses, _ := wenv.pauses(t, r, env.store, 0)
			w := NewWatcher(r, env.store, WatcherOptions{Interval: time.Hour, Pauses: pauses, Logger: zaptest.NewLogger(t), Metrics: m})
			task := pollTask(t, r.Client(), plan.TaskTypeNoop, res.Run.TaskDomain)
			if err := r.Client().UpdateTask(ctx, &model.TaskResult{TaskId: task.TaskId, WorkflowInstanceId: res.Run.WorkflowID, Status: model.CompletedTask}); err != nil {
				t.Fatal(err)
			}
			waitStatus(t, r.Client(), res.Run.WorkflowID, model.CompletedWorkflow)
			if err := w.Scan(ctx); err != nil {
				t.Fatal(err)
			}
			recs := waitFinal(t, env, r, res.Run.RunID)
			if got, want := strings.Join(eventTypes(recs), " "), "RunStarted RunPaused RunResumed RunCompleted"; got != want {
				t.Fatalf("log %s, want %s", got, want)
			}
			if _, alerts := statestore.Reduce(nil, recs); len(alerts) != 0 {
				t.Fatalf("the log raises an alert: %s", alerts[0].Reason)
			}
			snap, err := env.store.ProjectSnapshot(ctx, res.Run.RunID)
			if err != nil || snap.Status != statestore.RunStatusCompleted {
				t.Fatalf("snapshot %+v %v, want COMPLETED", snap, err)
			}
			if n := testutil.ToFloat64(m.actions[actionTerminalRefused]); n != 0 {
				t.Fatalf("terminal_refused %v, want 0", n)
			}
		})
	}
}
