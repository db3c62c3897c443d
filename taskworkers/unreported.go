package taskworkers

import (
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
)

// maxUnreportedBytes bounds the outputs held by unreportedOutputs (the
// sizes of the updates that carried them), as maxKept bounds their number;
// the oldest go first.
const maxUnreportedBytes = 64 << 20

// stepAttempt names a logical attempt of a run's step.
type stepAttempt struct {
	run, step string
	logical   int64
}

// unreportedOutputs are the outputs outside workers reported with an
// outcome that was recorded (StepCompleted) but whose update did not
// reach Conductor. Conductor then times the try out and schedules the
// next, which the gate answers from the log without running the step
// again: with the output kept here, the worker's data reaches Conductor
// with it. They live in memory, for keptFor: after a restart, or on
// another replica, the next try is answered without them.
type unreportedOutputs struct {
	mu    sync.Mutex
	m     map[stepAttempt]unreported
	bytes int
}

type unreported struct {
	out  map[string]any
	size int
	at   time.Time
}

func (u *unreportedOutputs) keep(k stepAttempt, out map[string]any, size int) {
	if size > maxUnreportedBytes {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = make(map[stepAttempt]unreported)
	}
	u.dropLocked(k)
	for len(u.m) > 0 && (u.bytes+size > maxUnreportedBytes || len(u.m) >= maxKept) {
		var oldest stepAttempt
		var at time.Time
		for k, o := range u.m {
			if at.IsZero() || o.at.Before(at) {
				oldest, at = k, o.at
			}
		}
		u.dropLocked(oldest)
	}
	u.m[k] = unreported{out: out, size: size, at: time.Now()}
	u.bytes += size
}

// take removes and returns the output kept for k, if one is, and not
// older than keptFor.
func (u *unreportedOutputs) take(k stepAttempt) (map[string]any, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	o, ok := u.m[k]
	u.dropLocked(k)
	return o.out, ok && time.Since(o.at) < keptFor
}

func (u *unreportedOutputs) dropLocked(k stepAttempt) {
	if o, ok := u.m[k]; ok {
		u.bytes -= o.size
		delete(u.m, k)
	}
}

// Unreported is called when a forwarded update r of t, whose outcome
// Record recorded, did not reach Conductor (no answer, or a 5xx); size is
// the update's size. The output of a COMPLETED one is kept for the next
// try, which the gate answers from the log.
func (w *Worker) Unreported(t *model.Task, a *Assignment, r *model.TaskResult, size int) {
	if a == nil || r.Status != model.CompletedTask {
		return
	}
	_, logical := a.Attempts(int(t.RetryCount))
	w.unreported.keep(stepAttempt{run: a.RunID, step: a.Step.StepID, logical: logical}, r.OutputData, size)
}
