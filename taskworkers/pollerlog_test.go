package taskworkers

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// downTasks fails every poll until up is set, counting them.
type downTasks struct {
	failed chan struct{}
	up     atomic.Bool
}

func (d *downTasks) BatchPoll(context.Context, string, string, int, time.Duration) ([]model.Task, error) {
	if d.up.Load() {
		return nil, nil
	}
	select {
	case d.failed <- struct{}{}:
	default:
	}
	return nil, errors.New("dial tcp: connection refused")
}

func (d *downTasks) UpdateTask(context.Context, *model.TaskResult) error { return nil }

// With Conductor away, a poll loop's failures are logged once a minute
// (the next line counting those held back), and its recovery once: before,
// each of serve's four loops wrote a line every 5 s for as long as
// Conductor was away.
func TestPoller_FailuresAreLoggedBounded(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	tasks := &downTasks{failed: make(chan struct{}, 1)}
	p := &poller{
		tasks: tasks, taskType: "noop", workerID: "w", concurrency: 1, batch: 1,
		interval: time.Millisecond, maxInterval: time.Millisecond, linger: time.Millisecond,
		handle: func(*model.Task) {}, release: func(*model.Task) {}, took: func([]model.Task) {}, lost: func() {},
		log: zap.New(core), wake: make(chan struct{}, 1), freed: make(chan struct{}, 1),
	}
	pollCtx, stop := context.WithCancel(context.Background())
	var working sync.WaitGroup
	done := make(chan struct{})
	go func() { defer close(done); p.run(pollCtx, context.Background(), &working) }()
	for range 5 {
		<-tasks.failed
	}
	tasks.up.Store(true)
	deadline := time.Now().Add(time.Minute)
	for logs.FilterMessageSnippet("polling recovered").Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	working.Wait()
	if n := logs.FilterMessageSnippet("poll failed").Len(); n != 1 {
		t.Fatalf("%d lines for 5 failed polls, want 1", n)
	}
	if n := logs.FilterMessageSnippet("polling recovered").Len(); n != 1 {
		t.Fatalf("%d recovery lines, want 1", n)
	}
}
