package taskworkers

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/conductor-sdk/conductor-go/sdk/model"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/ratelog"
)

// poller is the poll machinery of one task type, apart from what a task
// means (as temporal sdk-go's baseWorker is apart from its task handlers):
// it keeps at most concurrency tasks in hand, asks Conductor for as many
// as it has free slots (batch at most; while busy it waits up to linger
// for half a batch of free slots, so that a busy loop sends one poll per
// several tasks instead of one per task), gives each to handle in a
// goroutine of its own, backs off while Conductor does not answer, and
// ends when polling stops. It knows nothing of runs, steps or the log.
type poller struct {
	tasks       TaskClient
	taskType    string
	workerID    string
	concurrency int
	batch       int
	// interval is the pause after a poll that found nothing; timeout the
	// server-side wait of a poll (Options.PollInterval, PollTimeout).
	interval, timeout time.Duration
	// maxInterval bounds the idle pause, which doubles from interval
	// with each consecutive empty poll (Options.PollIntervalMax).
	maxInterval time.Duration
	// linger is how long a busy loop waits for half a batch of free slots.
	linger time.Duration
	// handle runs one task to its report; release hands back a task
	// polled as polling stopped.
	handle  func(*model.Task)
	release func(*model.Task)
	// took is told every task a poll returned, before any is handled;
	// lost is told of a poll that failed after it may have reached
	// Conductor (any error but a refused connection): Conductor may have
	// handed it tasks that never arrived.
	took    func([]model.Task)
	lost    func()
	metrics *Metrics
	log     *zap.Logger
	// down bounds the lines of failed polls while Conductor is away.
	down ratelog.Limiter
	// wake ends the idle wait and resets it to interval: a reported
	// outcome makes Conductor schedule the step's successors.
	wake chan struct{}
	// freed is signalled (without blocking) when a task's slot frees.
	freed chan struct{}

	// callbacks are the times at which tasks this loop's type handed back
	// come back to Conductor's queue (wakeAt); it wakes the loop at each.
	callbacks callbackWakes
}

// nudge ends the poller's idle wait. It never blocks.
func (p *poller) nudge() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// callbackWakeStep rounds up the times at which a loop is woken for the
// tasks it handed back: tasks handed back within it (one poll's batch, in
// practice) come back to one wake, so a loop is woken for callbacks at
// most once per step.
const callbackWakeStep = 100 * time.Millisecond

// wakeAt wakes the loop at at (rounded up to callbackWakeStep): a task of
// its type handed back with a callback is in Conductor's queue again
// then. It never blocks.
func (p *poller) wakeAt(at time.Time) {
	p.callbacks.add(at.Add(callbackWakeStep-1).Truncate(callbackWakeStep), p.nudge)
}

// callbackWakes calls a nudge at each of a set of times, with one timer
// for the earliest. It is safe for concurrent use; the zero value is
// ready, and stop ends it.
type callbackWakes struct {
	mu      sync.Mutex
	due     []time.Time // sorted, distinct
	timer   *time.Timer
	stopped bool
}

// add calls nudge at at (once for every time added more than once).
func (c *callbackWakes) add(at time.Time, nudge func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, found := slices.BinarySearchFunc(c.due, at, time.Time.Compare)
	if c.stopped || found {
		return
	}
	c.due = slices.Insert(c.due, i, at)
	if i == 0 {
		c.arm(nudge)
	}
}

// arm sets the timer for the earliest time; c.mu is held.
func (c *callbackWakes) arm(nudge func()) {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if len(c.due) == 0 || c.stopped {
		return
	}
	c.timer = time.AfterFunc(time.Until(c.due[0]), func() {
		c.mu.Lock()
		now := time.Now()
		n := 0
		for n < len(c.due) && !c.due[n].After(now) {
			n++
		}
		c.due = c.due[n:]
		c.arm(nudge)
		c.mu.Unlock()
		nudge()
	})
}

// stop drops the times not reached and ignores later ones.
func (c *callbackWakes) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped, c.due = true, nil
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// run polls until pollCtx ends. A poll is bounded by workCtx and by
// timeout + 10 s, never by pollCtx: Conductor would go on long-polling for
// an abandoned request and could hand it a task nobody receives (stuck
// IN_PROGRESS until its response timeout); what a poll returns after
// polling stopped is released. Each task's goroutine is counted in working.
func (p *poller) run(pollCtx, workCtx context.Context, working *sync.WaitGroup) {
	defer p.callbacks.stop()
	slots := make(chan struct{}, p.concurrency)
	backoff := time.Duration(0)
	busy := false // the last poll found tasks
	idle := p.interval
	for {
		// Wait for at least one free slot before polling, so tasks are
		// never taken without capacity to run them.
		select {
		case slots <- struct{}{}:
			<-slots
		case <-pollCtx.Done():
			return
		}
		if busy && !p.lingerFor(pollCtx, slots) {
			return
		}
		free := p.concurrency - len(slots)
		p.metrics.poll(p.taskType)
		pctx, cancel := context.WithTimeout(workCtx, p.timeout+10*time.Second)
		tasks, err := p.tasks.BatchPoll(pctx, p.taskType, p.workerID, min(free, p.batch), p.timeout)
		cancel()
		if pollCtx.Err() != nil {
			for i := range tasks {
				p.release(&tasks[i])
			}
			return
		}
		if err != nil {
			p.metrics.pollError(p.taskType)
			if mayHaveReachedConductor(err) {
				p.lost()
			}
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			p.down.Warn(p.log, "poll failed; backing off", zap.Duration("backoff", backoff), zap.Error(err))
			select {
			case <-time.After(backoff):
			case <-pollCtx.Done():
				return
			}
			continue
		}
		if backoff > 0 {
			p.down.Recovered(p.log, "polling recovered")
			backoff = 0
		}
		p.metrics.polled(p.taskType, len(tasks))
		if len(tasks) > 0 {
			p.took(tasks)
		}
		busy = len(tasks) > 0
		if len(tasks) == 0 {
			// Nothing queued: wait before the next poll, twice as long as
			// the last time (up to maxInterval) after consecutive empty
			// polls. Conductor's batch poll answers at once with what is
			// queued (wait 0); it does not wake a waiting poll for a new
			// task (see Options.PollTimeout). A wake polls at once and
			// starts the backoff over.
			select {
			case <-time.After(idle):
				idle = min(2*idle, max(p.maxInterval, p.interval))
			case <-p.wake:
				idle = p.interval
			case <-pollCtx.Done():
				return
			}
			continue
		}
		idle = p.interval
		for i := range tasks {
			slots <- struct{}{}
			t := tasks[i]
			working.Add(1)
			go func() {
				defer working.Done()
				defer func() {
					<-slots
					select {
					case p.freed <- struct{}{}:
					default:
					}
				}()
				p.handle(&t)
			}()
		}
	}
}

// lingerFor waits until half a batch of slots is free (at least one, at
// most all of them) or linger has passed, whichever comes first. It
// reports false when polling stopped.
func (p *poller) lingerFor(pollCtx context.Context, slots chan struct{}) bool {
	want := max(1, min(p.batch, p.concurrency)/2)
	if p.linger <= 0 || p.concurrency-len(slots) >= want {
		return true
	}
	t := time.NewTimer(p.linger)
	defer t.Stop()
	for p.concurrency-len(slots) < want {
		select {
		case <-p.freed:
		case <-t.C:
			return true
		case <-pollCtx.Done():
			return false
		}
	}
	return true
}

// mayHaveReachedConductor reports whether a failed poll may have been
// answered by Conductor: every error but one from dialing (a refused or
// unreachable connection). A reset, an EOF or a timeout after the request
// was sent can lose an answer whose tasks Conductor marked IN_PROGRESS.
func mayHaveReachedConductor(err error) bool {
	var op *net.OpError
	return !errors.As(err, &op) || op.Op != "dial"
}
