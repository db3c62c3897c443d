package taskworkers

import (
	"context"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"
)

// Strays: tasks Conductor handed to a poll whose answer never arrived.
//
// A batch poll that fails after it reached Conductor (the connection reset
// as Conductor restarts, a timeout, an EOF) may have taken tasks: Conductor
// marks them IN_PROGRESS under this worker id and waits for a report until
// their response timeout (the step timeout + 120 s), minutes during which
// the run stands still. After such a failure the worker waits until no
// poll still under way can deliver (PollTimeout + 10 s, a poll's deadline,
// plus a second), asks Options.Recover for the tasks Conductor shows in
// progress under its id, and hands back those no poll of this process
// returned. The wait is what makes this safe: a task handed back while a
// poll was still carrying it to us would run twice.
//
// A process killed in the middle of a run's start leaves strays of
// another kind: its poll took the workflow's first task before the
// workflow was recorded, so the next process cannot list it (Recover reads
// the workflows of the recorded runs) until the watcher adopts the
// workflow, once the start's lease expires. The watcher then asks for a
// look (StrayLook).

// strayCheckEvery bounds how often the strays are looked for: each look
// reads every active run's workflow (Options.Recover).
const strayCheckEvery = 30 * time.Second

// noteTaken records tasks a poll returned.
func (w *Worker) noteTaken(tasks []model.Task) {
	w.takenMu.Lock()
	defer w.takenMu.Unlock()
	for i := range tasks {
		w.taken[tasks[i].TaskId] = struct{}{}
	}
}

// forgetTaken drops a task whose report is done (or given up): it is no
// longer this process's.
func (w *Worker) forgetTaken(id string) {
	w.takenMu.Lock()
	defer w.takenMu.Unlock()
	delete(w.taken, id)
}

func (w *Worker) wasTaken(id string) bool {
	w.takenMu.Lock()
	defer w.takenMu.Unlock()
	_, ok := w.taken[id]
	return ok
}

// StrayLook lets a component outside the workers ask them for a look for
// strays: the watcher, when it adopts the workflow of a crashed start. It
// exists apart from the Worker, as Wakeup does, so that each side can be
// built with it in its constructor. The zero value is not ready; use
// NewStrayLook.
type StrayLook struct {
	mu      sync.Mutex
	workers []*Worker
}

// NewStrayLook returns a StrayLook that asks no worker until one is built
// with it (Options.StrayLook).
func NewStrayLook() *StrayLook { return &StrayLook{} }

// Ask asks every worker built with s for a look for strays, after the
// wait that makes it safe. It never blocks; asks during a wait are one.
func (s *StrayLook) Ask() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.workers {
		w.pollLost()
	}
}

func (s *StrayLook) add(w *Worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.workers = append(s.workers, w)
}

// pollLost asks for a look for strays. It never blocks.
func (w *Worker) pollLost() {
	select {
	case w.lost <- struct{}{}:
	default:
	}
}

// recoverStrays looks for strays after every lost poll answer (several
// lost answers in a row make one look), until ctx ends.
func (w *Worker) recoverStrays(ctx context.Context) {
	last := time.Time{}
	for {
		select {
		case <-w.lost:
		case <-ctx.Done():
			return
		}
		wait := max(w.opts.PollTimeout+11*time.Second, time.Until(last.Add(strayCheckEvery)))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
		select { // lost answers during the wait are covered by this look
		case <-w.lost:
		default:
		}
		last = time.Now()
		w.handBackStrays(ctx)
	}
}

// handBackStrays hands back every task Conductor shows in progress under
// this worker id that no poll of this process returned, retrying the
// listing (it reads Conductor) with a backoff until it succeeds.
func (w *Worker) handBackStrays(ctx context.Context) {
	backoff := time.Second
	for {
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		tasks, err := w.opts.Recover(lctx)
		cancel()
		if err == nil {
			for i := range tasks {
				t := &tasks[i]
				if w.wasTaken(t.TaskId) {
					continue
				}
				w.log.Warn("handing back a task in progress under this worker id that no poll of this process returned (a lost poll answer, or a process killed during the run's start)",
					zap.String("taskId", t.TaskId), zap.String("workflowId", t.WorkflowInstanceId))
				w.opts.Metrics.handedBack(handBackLost)
				w.handBack(t, 0, "lost poll answer")
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		w.log.Warn("cannot list the tasks in progress under this worker id; retrying", zap.Error(err), zap.Duration("backoff", backoff))
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}
