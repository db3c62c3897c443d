package taskworkers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/errcode"
)

// countingTasks hands out tasks of one type and records the count of
// every poll; UpdateTask is not used by the poller.
type countingTasks struct {
	mu     sync.Mutex
	counts []int
	polled chan int
	next   int
}

func (c *countingTasks) BatchPoll(_ context.Context, _, _ string, count int, _ time.Duration) ([]model.Task, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts = append(c.counts, count)
	tasks := make([]model.Task, count)
	for i := range tasks {
		c.next++
		tasks[i].TaskId = fmt.Sprint(c.next)
	}
	c.polled <- count
	return tasks, nil
}

func (c *countingTasks) UpdateTask(context.Context, *model.TaskResult) error { return nil }

// TestPoller_BatchesWhileBusy: a busy poll loop waits for half a batch of
// free slots (or the linger) before it polls again, instead of polling for
// each slot as it frees (that made 1.6 polls per step under load, against
// 0.18 for a raw batch-poll loop); an idle loop polls at once.
func TestPoller_BatchesWhileBusy(t *testing.T) {
	release := make(chan struct{})
	tasks := &countingTasks{polled: make(chan int, 100)}
	p := &poller{
		tasks: tasks, taskType: "noop", workerID: "w", concurrency: 8, batch: 8,
		interval: time.Hour, linger: time.Hour,
		handle:  func(*model.Task) { <-release },
		release: func(*model.Task) {}, took: func([]model.Task) {}, lost: func() {},
		log: zaptest.NewLogger(t), wake: make(chan struct{}, 1), freed: make(chan struct{}, 1),
	}
	pollCtx, stop := context.WithCancel(context.Background())
	var working sync.WaitGroup
	done := make(chan struct{})
	go func() { defer close(done); p.run(pollCtx, context.Background(), &working) }()
	if n := <-tasks.polled; n != 8 {
		t.Fatalf("first poll asked for %d tasks, want 8 (all slots free)", n)
	}
	for i := 1; i <= 3; i++ {
		release <- struct{}{}
		select {
		case n := <-tasks.polled:
			t.Fatalf("polled for %d tasks with %d slots free; want a poll once 4 are free", n, i)
		case <-time.After(50 * time.Millisecond):
		}
	}
	release <- struct{}{}
	select {
	case n := <-tasks.polled:
		if n != 4 {
			t.Fatalf("polled for %d tasks, want 4", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no poll with half the slots free")
	}
	stop()
	close(release)
	<-done
	working.Wait()
}

// TestNew_PollersPerTypeSplitTheSlots: with several poll loops per task
// type the type's concurrency is split between them, so that together
// they never hold more tasks than it allows; never more loops than slots.
func TestNew_PollersPerTypeSplitTheSlots(t *testing.T) {
	for _, tc := range []struct {
		pollers, slots int
		want           []int
	}{
		{0, 16, []int{16}},
		{1, 16, []int{16}},
		{4, 16, []int{4, 4, 4, 4}},
		{3, 16, []int{6, 5, 5}},
		{4, 3, []int{1, 1, 1}},
	} {
		w := New(&countingTasks{}, nil, nil, nil, nil, Options{WorkerID: "w", Concurrency: map[string]int{"noop": tc.slots}, PollersPerType: tc.pollers})
		var got []int
		for _, p := range w.pollers {
			got = append(got, p.concurrency)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%d pollers for %d slots: loops with %v slots, want %v", tc.pollers, tc.slots, got, tc.want)
		}
	}
}

// typedTasks answers every poll empty and reports each poll's task type.
type typedTasks struct{ polled chan string }

func (c *typedTasks) BatchPoll(_ context.Context, taskType, _ string, _ int, _ time.Duration) ([]model.Task, error) {
	c.polled <- taskType
	return nil, nil
}

func (c *typedTasks) UpdateTask(context.Context, *model.TaskResult) error { return nil }

// TestWorker_OutcomeWakesItsPlansTypes: a reported outcome wakes the poll
// loops of the task types its plan uses (learned from the polls), not
// every loop: waking all of them made each idle type poll once per step
// of another type. A task of a plan never polled wakes every loop.
func TestWorker_OutcomeWakesItsPlansTypes(t *testing.T) {
	tasks := &typedTasks{polled: make(chan string, 100)}
	w := New(tasks, nil, nil, nil, nil, Options{WorkerID: "w", PollInterval: time.Hour,
		Concurrency: map[string]int{"noop": 1, "sleep": 1, "command": 1}, Logger: zaptest.NewLogger(t)})
	ctx, stop := context.WithCancel(context.Background())
	var polling, working sync.WaitGroup
	for _, p := range w.pollers {
		polling.Add(1)
		go func() { defer polling.Done(); p.run(ctx, ctx, &working) }()
	}
	defer func() { stop(); polling.Wait() }()
	// polls collects the task types polled within d.
	polls := func(d time.Duration) map[string]int {
		got := map[string]int{}
		deadline := time.After(d)
		for {
			select {
			case tt := <-tasks.polled:
				got[tt]++
			case <-deadline:
				return got
			}
		}
	}
	if got := polls(200 * time.Millisecond); len(got) != 3 {
		t.Fatalf("first polls %v, want one of each type", got)
	}
	task := func(taskType, planID string) *model.Task {
		return &model.Task{TaskId: planID + taskType, TaskType: taskType, WorkflowType: "sidecar_t_" + planID + "_1",
			InputData: map[string]any{"planId": planID, "planVersion": "1"}}
	}
	outcome := func(tk *model.Task) {
		w.update(tk, w.log, &model.TaskResult{Status: model.CompletedTask})
	}

	w.took([]model.Task{*task("noop", "chain")})
	outcome(task("noop", "chain"))
	if got := polls(200 * time.Millisecond); fmt.Sprint(got) != "map[noop:1]" {
		t.Errorf("a noop-only plan's outcome: polls %v, want map[noop:1]", got)
	}

	w.took([]model.Task{*task("noop", "mixed"), *task("sleep", "mixed")})
	outcome(task("noop", "mixed"))
	if got := polls(200 * time.Millisecond); fmt.Sprint(got) != "map[noop:1 sleep:1]" {
		t.Errorf("a noop+sleep plan's outcome: polls %v, want map[noop:1 sleep:1]", got)
	}

	outcome(task("noop", "unknown"))
	if got := polls(200 * time.Millisecond); fmt.Sprint(got) != "map[command:1 noop:1 sleep:1]" {
		t.Errorf("an unknown plan's outcome: polls %v, want every type once", got)
	}

	// An outside worker's outcome (forwarded by the task proxy): no loop
	// of this worker polls its type, so it wakes its plan's types only.
	w.Reported(task("bench_external", "mixed"), nil, &model.TaskResult{Status: model.CompletedTask})
	if got := polls(200 * time.Millisecond); fmt.Sprint(got) != "map[noop:1 sleep:1]" {
		t.Errorf("an outside worker's outcome in a noop+sleep plan: polls %v, want map[noop:1 sleep:1]", got)
	}
}

// TestPlanTypes_UnnumberedLoopWakesAll: past 64 polled types a type has
// no bit of its own, so its outcome wakes every loop (its own among them);
// a type no loop polls adds nothing to its plan's types.
func TestPlanTypes_UnnumberedLoopWakesAll(t *testing.T) {
	var types []string
	for i := 0; i < 70; i++ {
		types = append(types, fmt.Sprintf("t%d", i))
	}
	pt := newPlanTypes(types)
	in := map[string]any{"planId": "p", "planVersion": "1"}
	pt.learn([]model.Task{{TaskType: "t0", WorkflowType: "sidecar_t_p_1", InputData: in}})
	if m, _ := pt.typesOf(&model.Task{TaskType: "t65", WorkflowType: "sidecar_t_p_1", InputData: in}, false); !m.all {
		t.Errorf("outcome of the 66th polled type: wakes %+v, want every loop", m)
	}
	if m, _ := pt.typesOf(&model.Task{TaskType: "outside", WorkflowType: "sidecar_t_p_1", InputData: in}, false); m.all || !m.has("t0") || m.has("t1") {
		t.Errorf("outcome of a type no loop polls: wakes all=%v t0=%v t1=%v, want t0 only", m.all, m.has("t0"), m.has("t1"))
	}
}

// TestPlanTypes_NoPlanWakesItsDefinitionsTypes: a task of no plan (an
// adopted workflow's) wakes only the types polled for its workflow
// definition before: none for an outside worker's task of a definition
// whose tasks no loop polled, and never every loop.
func TestPlanTypes_NoPlanWakesItsDefinitionsTypes(t *testing.T) {
	pt := newPlanTypes([]string{"noop", "sleep"})
	outside := &model.Task{TaskType: "outside", WorkflowType: "legacy"}
	if m, resolve := pt.typesOf(outside, true); m.all || m.has("noop") || m.has("sleep") || resolve {
		t.Errorf("an adopted workflow's outside task: wakes all=%v noop=%v sleep=%v (resolve %v), want none", m.all, m.has("noop"), m.has("sleep"), resolve)
	}
	pt.learn([]model.Task{{TaskType: "noop", WorkflowType: "legacy"}})
	if m, _ := pt.typesOf(outside, true); m.all || !m.has("noop") || m.has("sleep") {
		t.Errorf("after a noop task of the definition was polled: wakes all=%v noop=%v sleep=%v, want noop only", m.all, m.has("noop"), m.has("sleep"))
	}
	if m, _ := pt.typesOf(&model.Task{TaskType: "outside", WorkflowType: "other"}, true); m.all || m.has("noop") {
		t.Errorf("another definition's outside task: wakes all=%v noop=%v, want none", m.all, m.has("noop"))
	}
}

// TestPlanTypes_MissingDefinitionIsNotReadAgain: a plan whose workflow
// definition Conductor does not have falls back to the types polled for
// it, without a read per outcome; after another error the next outcome
// reads it again.
func TestPlanTypes_MissingDefinitionIsNotReadAgain(t *testing.T) {
	pt := newPlanTypes([]string{"noop", "sleep"})
	task := func(planID string) *model.Task {
		return &model.Task{TaskType: "outside", WorkflowType: "sidecar_t_" + planID + "_1", InputData: map[string]any{"planId": planID, "planVersion": "1"}}
	}
	if _, resolve := pt.typesOf(task("gone"), true); !resolve {
		t.Fatal("first outcome of a plan: no read of its definition")
	}
	if m := pt.resolved("sidecar_t_gone_1", nil, fmt.Errorf("get: %w", errcode.NotFound)); !m.all {
		t.Errorf("a plan of no definition and no polls: wakes all=%v, want every loop", m.all)
	}
	if _, resolve := pt.typesOf(task("gone"), true); resolve {
		t.Error("a plan whose definition Conductor does not have is read again")
	}
	pt.typesOf(task("flaky"), true)
	pt.resolved("sidecar_t_flaky_1", nil, errors.New("connection reset"))
	if _, resolve := pt.typesOf(task("flaky"), true); !resolve {
		t.Error("after a failed read the plan's definition is not read again")
	}
}

// TestCallbackWakes_EachTimeOnce: every time added is nudged once, in
// order, whatever order it was added in (an earlier time added after a
// later one re-arms the timer; a later one is nudged after the earlier
// fired); a time added twice is nudged once; after stop nothing is.
func TestCallbackWakes_EachTimeOnce(t *testing.T) {
	var c callbackWakes
	nudged := make(chan time.Time, 16)
	nudge := func() { nudged <- time.Now() }
	start := time.Now()
	for _, d := range []time.Duration{600, 200, 600, 1000} {
		c.add(start.Add(d*time.Millisecond), nudge)
	}
	var got []time.Duration
	for range 3 {
		select {
		case at := <-nudged:
			got = append(got, at.Sub(start))
		case <-time.After(time.Minute):
			t.Fatalf("nudged at %v, then nothing within a minute; want 3 nudges (200, 600, 1000 ms)", got)
		}
	}
	for i, want := range []time.Duration{200, 600, 1000} {
		if got[i] < want*time.Millisecond {
			t.Fatalf("nudges at %v: nudge %d came before %v", got, i, want*time.Millisecond)
		}
	}
	c.add(time.Now().Add(100*time.Millisecond), nudge)
	c.stop()
	c.add(time.Now().Add(100*time.Millisecond), nudge)
	select {
	case at := <-nudged:
		t.Fatalf("nudged at %v after stop (or a repeated time twice); nudges before: %v", at.Sub(start), got)
	case <-time.After(time.Second):
	}
}
