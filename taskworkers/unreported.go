package taskworkers

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/ratelog"
)

// maxUnreportedBytes bounds the outputs held by unreportedOutputs (the
// sizes of the updates that carried them), as maxKept bounds their number;
// the oldest go first.
const maxUnreportedBytes = 64 << 20

// keepTimeout bounds one call to Options.OutputKeep.
const keepTimeout = 5 * time.Second

// OutputKeep keeps outside workers' unreported outputs where the next
// process and every replica read them (Options.OutputKeep; *keep.Store
// satisfies it). Get answers nil, nil when nothing is kept under name.
type OutputKeep interface {
	Put(ctx context.Context, name string, data []byte) error
	Get(ctx context.Context, name string) ([]byte, error)
	Delete(ctx context.Context, name string) error
}

// stepAttempt names a logical attempt of a run's step.
type stepAttempt struct {
	run, step string
	logical   int64
}

// name is k's object name in an OutputKeep.
func (k stepAttempt) name() string {
	return k.run + "/" + strconv.FormatInt(k.logical, 10) + "/" + k.step
}

// unreportedOutputs are the outputs outside workers reported with an
// outcome that was recorded (StepCompleted) but whose update did not
// reach Conductor. Conductor then times the try out and schedules the
// next, which the gate answers from the log without running the step
// again: with the output kept here, the worker's data reaches Conductor
// with it. They live in memory, for keptFor, and in durable (when set), so
// that after a restart, or on another replica, the next try is answered
// with them too.
type unreportedOutputs struct {
	durable OutputKeep
	log     *zap.Logger
	// down bounds the lines of a keep that fails (NATS away along with
	// Conductor): one a minute, not one per update.
	down ratelog.Limiter

	mu    sync.Mutex
	m     map[stepAttempt]unreported
	bytes int
}

type unreported struct {
	out  map[string]any
	size int
	at   time.Time
}

// keep keeps out for k, in durable first: the caller answers the worker
// once it is kept.
func (u *unreportedOutputs) keep(ctx context.Context, k stepAttempt, out map[string]any, size int) {
	if u.durable != nil {
		u.putDurable(ctx, k, out)
	}
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

func (u *unreportedOutputs) putDurable(ctx context.Context, k stepAttempt, out map[string]any) {
	data, err := json.Marshal(out)
	if err == nil {
		ctx, cancel := context.WithTimeout(ctx, keepTimeout)
		err = u.durable.Put(ctx, k.name(), data)
		cancel()
	}
	if err != nil {
		u.down.Warn(u.log, "could not keep an outside worker's output where another process can read it; it is kept in this process's memory only", zap.String("runId", k.run),
			zap.String("stepId", k.step), zap.Error(err))
	}
}

// take returns the output kept for k, if one is, and not older than
// keptFor: from memory, where it is dropped, or else from durable.
func (u *unreportedOutputs) take(ctx context.Context, k stepAttempt) (map[string]any, bool) {
	u.mu.Lock()
	o, ok := u.m[k]
	u.dropLocked(k)
	u.mu.Unlock()
	if ok && time.Since(o.at) < keptFor {
		return o.out, true
	}
	if u.durable == nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, keepTimeout)
	defer cancel()
	data, err := u.durable.Get(ctx, k.name())
	if err != nil {
		u.down.Warn(u.log, "could not read back an outside worker's kept output", zap.String("runId", k.run), zap.String("stepId", k.step), zap.Error(err))
		return nil, false
	}
	if data == nil {
		return nil, false
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		u.log.Warn("an outside worker's kept output does not decode", zap.String("runId", k.run), zap.String("stepId", k.step), zap.Error(err))
		return nil, false
	}
	return out, true
}

// forget drops what is kept for k: Conductor took an update carrying an
// output. The durable copy is dropped only when this process kept one
// (it knows of no other without a read, and the bucket's TTL ends them).
func (u *unreportedOutputs) forget(ctx context.Context, k stepAttempt) {
	u.mu.Lock()
	_, ok := u.m[k]
	u.dropLocked(k)
	u.mu.Unlock()
	if !ok || u.durable == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, keepTimeout)
	defer cancel()
	if err := u.durable.Delete(ctx, k.name()); err != nil {
		u.log.Debug("could not drop a kept output Conductor has now; it expires", zap.Error(err))
	}
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
	w.unreported.keep(w.workCtx, stepAttempt{run: a.RunID, step: a.Step.StepID, logical: logical}, r.OutputData, size)
}
