package taskworkers

import (
	"sync"
	"time"
)

// Bounds of the kept outcomes: a task Conductor never offers this process
// again (another replica took it, or its workflow ended) is forgotten after
// keptFor, and at most maxKept are held.
const (
	keptFor = time.Hour
	maxKept = 10_000
)

// keptOutcome is the outcome of a step that ran but whose StepCompleted or
// StepFailed the store did not take within the write budget, with what
// finish needs to record and report it later.
type keptOutcome struct {
	retryCount      int32 // the task's, when it ran
	res             Result
	engine, logical int64
	operatorAttempt bool
	took            time.Duration
	at              time.Time
}

// keptOutcomes holds them by task id until Conductor offers the task
// again (it was handed back): then the outcome is recorded and reported
// without running the step again. They live in memory: after a restart,
// or on another replica, the task runs again as the same attempt (as after
// a crash; docs/workers.md).
type keptOutcomes struct {
	mu sync.Mutex
	m  map[string]keptOutcome
}

func (k *keptOutcomes) keep(taskID string, o keptOutcome) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = make(map[string]keptOutcome)
	}
	if len(k.m) >= maxKept {
		oldest, at := "", time.Time{}
		for id, o := range k.m {
			if oldest == "" || o.at.Before(at) {
				oldest, at = id, o.at
			}
		}
		delete(k.m, oldest)
	}
	k.m[taskID] = o
}

// take removes and returns the outcome kept for taskID at retryCount, if
// one is, and not older than keptFor.
func (k *keptOutcomes) take(taskID string, retryCount int32) (keptOutcome, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	o, ok := k.m[taskID]
	if !ok {
		return o, false
	}
	delete(k.m, taskID)
	return o, o.retryCount == retryCount && time.Since(o.at) < keptFor
}
