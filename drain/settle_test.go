package drain_test

import (
	"context"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// conductorModel holds a workflow's pause state as Conductor would:
// resuming a workflow that is not paused is a conflict. Its pause can be
// held in flight, to order two calls the other way round from the log
// (the fault concurrent requests cause now and then on the real
// Conductor; e2e: TestE2E_ConcurrentPauseAndResume is the real
// storm).
type conductorModel struct {
	mu       sync.Mutex
	paused   bool
	entered  chan struct{} // receives when a pause call arrives
	release  chan struct{} // a pause call lands once this is closed
	holdNext bool
}

func (m *conductorModel) Pause(context.Context, string) error {
	m.mu.Lock()
	hold := m.holdNext
	m.holdNext = false
	m.mu.Unlock()
	if hold {
		m.entered <- struct{}{}
		<-m.release
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.paused = true
	return nil
}

func (m *conductorModel) Resume(context.Context, string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.paused {
		return conflictErr()
	}
	m.paused = false
	return nil
}

func (m *conductorModel) Terminate(context.Context, string, string) error { return nil }

func (m *conductorModel) isPaused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.paused
}

// TestController_ConcurrentPauseAndResumeEndAsTheLog: a pause and a resume
// of the same run at once append RunPaused then RunResumed, but the
// resume reaches Conductor first and the pause last. Conductor must end
// as the log says (RUNNING), not as the last call left it: each request
// reads the log again after its own call and applies a later state.
func TestController_ConcurrentPauseAndResumeEndAsTheLog(t *testing.T) {
	ctx := context.Background()
	mem, _ := setup(t, "a")
	eng := &conductorModel{entered: make(chan struct{}), release: make(chan struct{}), holdNext: true}
	c := drain.New(mem, emitter{mem}, eng, drain.Options{
		ActiveRuns: func(context.Context) ([]string, error) { return []string{"r"}, nil }, Logger: zaptest.NewLogger(t)})
	paused := make(chan error, 1)
	go func() {
		_, err := c.Pause(ctx, "r", drain.PauseRequest{Reason: "p"})
		paused <- err
	}()
	<-eng.entered // RunPaused recorded; its call to Conductor in flight
	if _, err := c.Resume(ctx, "r", drain.ResumeRequest{Reason: "r"}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	close(eng.release) // the pause lands after the resume
	if err := <-paused; err != nil {
		t.Fatalf("pause: %v", err)
	}
	snap, err := mem.ProjectSnapshot(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if snap.Status != statestore.RunStatusRunning {
		t.Fatalf("log %s, want RUNNING (RunResumed after RunPaused)", snap.Status)
	}
	if eng.isPaused() {
		t.Fatal("Conductor's workflow stays PAUSED while the log says RUNNING: the calls reached it in the other order")
	}
}
