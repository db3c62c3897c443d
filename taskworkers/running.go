package taskworkers

import (
	"context"
	"sync"
)

// Running is the set of steps a Worker runs, by run: what a cancel of the
// run interrupts. It exists apart from the Worker so that the drain
// controller, which cancels runs, and the Worker, which pauses them on a
// held failure, can each be built with the other's part in their
// constructor. The zero value is not ready; use NewRunning.
type Running struct {
	mu    sync.Mutex
	steps map[string]map[string]context.CancelFunc // runId -> taskId -> cancel
}

// NewRunning returns an empty set.
func NewRunning() *Running {
	return &Running{steps: map[string]map[string]context.CancelFunc{}}
}

// Interrupt cancels the running steps of runID (best effort: a command gets
// SIGTERM, then SIGKILL after its grace period). It returns the Conductor
// task ids of the steps it interrupted: their workers record their ends.
func (r *Running) Interrupt(runID string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.steps[runID]))
	for taskID, cancel := range r.steps[runID] {
		cancel()
		ids = append(ids, taskID)
	}
	return ids
}

// Steps returns how many steps of runID run now.
func (r *Running) Steps(runID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.steps[runID])
}

func (r *Running) track(runID, taskID string, cancel context.CancelFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.steps[runID] == nil {
		r.steps[runID] = map[string]context.CancelFunc{}
	}
	r.steps[runID][taskID] = cancel
}

func (r *Running) untrack(runID, taskID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.steps[runID], taskID)
	if len(r.steps[runID]) == 0 {
		delete(r.steps, runID)
	}
}
