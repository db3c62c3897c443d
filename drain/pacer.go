package drain

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
)

// staggerWorkers is how many staggered resumes are carried out at once. A
// resume is a snapshot read, an append and a Conductor call (tens of
// milliseconds); one at a time would cap a stagger near 30 runs a second.
const staggerWorkers = 8

// pacer holds the staggered resumes (ResumeLater entries) this replica
// owns and hands them out in the order of their times, never closer
// together than their times are: an entry is due at
//
//	max(at, last + max(0, at - lastAt))
//
// where last is when the entry before it was handed out and lastAt the
// latest time handed out. On time that is the entry's own time; behind
// (entries that fell due while no sidecar ran, or resumes slower than
// the stagger's spacing) the rest of the stagger is shifted by the delay,
// so it catches up at the asked rate instead of all at once. The shift
// ends when the queue is empty.
type pacer struct {
	mu    sync.Mutex
	byRun map[string]ScheduledResume
	order []ScheduledResume // by At, then RunID
	// taken holds the cycle of each entry handed out, until the schedule
	// no longer lists it, so that a read of the schedule made before the
	// entry was ended does not queue it again.
	taken        map[string]int64
	last, lastAt time.Time // zero: nothing handed out since the queue was empty
	wake         chan struct{}
}

func newPacer() *pacer {
	return &pacer{byRun: map[string]ScheduledResume{}, taken: map[string]int64{}, wake: make(chan struct{}, 1)}
}

// add queues e, or replaces the entry of its run; an entry of a cycle
// already handed out is ignored.
func (p *pacer) add(e ScheduledResume) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.taken[e.RunID]; ok && c >= e.Cycle {
		return
	}
	if old, ok := p.byRun[e.RunID]; ok {
		if old.Cycle == e.Cycle && old.At.Equal(e.At) {
			return
		}
		p.remove(old)
	}
	p.byRun[e.RunID] = e
	i := sort.Search(len(p.order), func(i int) bool { return less(e, p.order[i]) })
	p.order = append(p.order, ScheduledResume{})
	copy(p.order[i+1:], p.order[i:])
	p.order[i] = e
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func less(a, b ScheduledResume) bool {
	if !a.At.Equal(b.At) {
		return a.At.Before(b.At)
	}
	return a.RunID < b.RunID
}

// remove takes e out of the queue; the caller holds mu.
func (p *pacer) remove(e ScheduledResume) {
	delete(p.byRun, e.RunID)
	for i := range p.order {
		if p.order[i].RunID == e.RunID {
			p.order = append(p.order[:i], p.order[i+1:]...)
			return
		}
	}
}

// sync brings in the staggered entries of a read of the schedule: those
// this replica owns are queued, those it no longer owns leave the queue,
// and an entry handed out is forgotten once the schedule no longer lists
// it. An entry queued but not listed stays: it may have been written after
// the read began (carrying out one that has ended does nothing).
func (p *pacer) sync(listed []ScheduledResume, owns func(string) bool) {
	seen := make(map[string]bool, len(listed))
	for _, e := range listed {
		seen[e.RunID] = true
		if owns(e.RunID) {
			p.add(e)
			continue
		}
		p.mu.Lock()
		if old, ok := p.byRun[e.RunID]; ok {
			p.remove(old)
		}
		p.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.taken {
		if !seen[id] {
			delete(p.taken, id)
		}
	}
}

// takeDue hands out the first entry when it is due at now; otherwise it
// returns how long until it is (ok false when the queue is empty).
func (p *pacer) takeDue(now time.Time) (e ScheduledResume, wait time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.order) == 0 {
		p.last, p.lastAt = time.Time{}, time.Time{}
		return e, 0, false
	}
	e = p.order[0]
	due := e.At
	if !p.last.IsZero() {
		if d := p.last.Add(max(0, e.At.Sub(p.lastAt))); d.After(due) {
			due = d
		}
	}
	if wait = due.Sub(now); wait > 0 {
		return e, wait, true
	}
	p.remove(e)
	p.taken[e.RunID] = e.Cycle
	p.last = now
	if e.At.After(p.lastAt) {
		p.lastAt = e.At
	}
	return e, 0, true
}

// untake forgets that runID's entry of cycle was handed out, so that the
// next read of the schedule queues it again (its resume failed, or this
// replica no longer owns the run).
func (p *pacer) untake(runID string, cycle int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.taken[runID] == cycle {
		delete(p.taken, runID)
	}
}

// pace carries out the staggered resumes of the pacer as they fall due,
// up to staggerWorkers at once, until ctx ends. It looks again at least
// every Interval (the clock may be a test's).
func (c *Controller) pace(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, staggerWorkers)
	t := time.NewTimer(c.opts.Interval)
	defer t.Stop()
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		e, wait, ok := c.pacer.takeDue(c.opts.Now())
		if ok && wait <= 0 {
			wg.Add(1)
			go func() {
				defer func() { <-slots; wg.Done() }()
				c.resumeStaggered(ctx, e)
			}()
			continue
		}
		<-slots
		if !ok || wait > c.opts.Interval {
			wait = c.opts.Interval
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-c.pacer.wake:
		case <-t.C:
		}
	}
}

// resumeStaggered carries out one staggered resume the pacer handed out.
func (c *Controller) resumeStaggered(ctx context.Context, e ScheduledResume) {
	if !c.opts.Owner.Owns(e.RunID) {
		c.pacer.untake(e.RunID, e.Cycle) // its owner reads it from the schedule
		return
	}
	snap, err := c.snapshot(ctx, e.RunID)
	switch {
	case errors.Is(err, ErrRunNotFound):
		_ = c.opts.Schedule.EndResume(ctx, e.RunID, e.Cycle)
		return
	case err != nil:
		if ctx.Err() == nil {
			c.warns.Warn(c.logger, "staggered resume: cannot read the run; retrying after the next read of the schedule", zap.String("runId", e.RunID), zap.Error(err))
		}
		c.pacer.untake(e.RunID, e.Cycle)
		return
	}
	if !c.resumeLaterIfDue(ctx, snap, e) {
		c.pacer.untake(e.RunID, e.Cycle)
	}
}
