package adapter

import (
	"context"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/adapter/conductortest"
	"github.com/conductor-sidecar/sidecar/adapter/plan"
)

// A run whose next task Conductor keeps SCHEDULED, handed to no worker (no
// worker polls its type, or Conductor's queue lost it), is counted in
// sidecar_run_watcher_waiting_runs once a full read sees it waiting longer
// than WaitingAfter, and no longer once a worker took the task. Nothing
// flagged such runs before: they stayed RUNNING for minutes with every
// metric quiet.
func TestWatcher_TaskWaitingForAWorker(t *testing.T) {
	u := conductortest.URL(t)
	ctx := context.Background()
	env := newNATS(t) // a task domain of its own: nothing polls it but this test
	r := env.newRuns(t, u, RunsOptions{})
	m := NewMetrics(prometheus.NewRegistry())
	w := NewWatcher(r, env.store, WatcherOptions{Interval: time.Hour, ReconcileInterval: time.Hour, WaitingAfter: time.Second,
		Logger: zaptest.NewLogger(t), Metrics: m})
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(ctx) })
	p := compilePlan(t, &plan.Plan{PlanID: "plan-" + suffix(t), PlanVersion: "1", Steps: []plan.Step{
		{StepID: "a", Executor: plan.ExecutorSpec{Type: plan.ExecutorNoop}},
	}})
	res, err := r.StartRun(ctx, request(p, "req"))
	if err != nil {
		t.Fatal(err)
	}
	waiting := func() float64 { return testutil.ToFloat64(m.waitingRuns) }

	if err := w.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if n := waiting(); n != 0 {
		t.Fatalf("waiting runs %v right after the start, want 0", n)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := w.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if n := waiting(); n != 1 {
		t.Fatalf("waiting runs %v with a's task scheduled for 1.5 s and nothing polling it, want 1", n)
	}

	// A worker takes the task: the run no longer waits.
	pollTask(t, r.Client(), plan.TaskTypeNoop, res.Run.TaskDomain)
	if err := w.Scan(ctx); err != nil {
		t.Fatal(err)
	}
	if n := waiting(); n != 0 {
		t.Fatalf("waiting runs %v once a worker took the task, want 0", n)
	}
}

func TestWaitingTask(t *testing.T) {
	now := time.UnixMilli(1_700_000_600_000)
	long := now.Add(-11 * time.Minute).UnixMilli()
	for _, tt := range []struct {
		name string
		task model.Task
		want bool
	}{
		{"worker task scheduled long ago", model.Task{TaskType: "resize", Status: "SCHEDULED", ScheduledTime: long}, true},
		{"worker task scheduled just now", model.Task{TaskType: "resize", Status: "SCHEDULED", ScheduledTime: now.Add(-time.Minute).UnixMilli()}, false},
		{"a retry delayed by Conductor, not due yet", model.Task{TaskType: "resize", Status: "SCHEDULED", ScheduledTime: long, CallbackAfterSeconds: 600}, false},
		{"a retry delayed by Conductor, due long ago", model.Task{TaskType: "resize", Status: "SCHEDULED", ScheduledTime: long, CallbackAfterSeconds: 10}, true},
		{"worker task in progress", model.Task{TaskType: "resize", Status: "IN_PROGRESS", ScheduledTime: long}, false},
		{"worker task completed", model.Task{TaskType: "resize", Status: "COMPLETED", ScheduledTime: long}, false},
		{"system task scheduled (3.21 shows HTTP so while it calls)", model.Task{TaskType: "HTTP", Status: "SCHEDULED", ScheduledTime: long}, false},
		{"control task scheduled", model.Task{TaskType: "WAIT", Status: "SCHEDULED", ScheduledTime: long}, false},
		{"no scheduled time", model.Task{TaskType: "resize", Status: "SCHEDULED"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := waitingTask([]model.Task{{TaskType: "a", Status: "COMPLETED"}, tt.task}, now, 10*time.Minute)
			if (got != nil) != tt.want {
				t.Fatalf("waitingTask = %+v, want waiting %v", got, tt.want)
			}
		})
	}
}
