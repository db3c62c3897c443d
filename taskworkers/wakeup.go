package taskworkers

import "sync"

// Wakeup ends the idle wait of the poll loops of the Workers built with
// it (Options.Wakeup), for the components outside the workers that make
// tasks pollable in Conductor: admission control when it starts a queued
// run, the drain controller when it resumes a run (through the API, in
// bulk, at a scheduled time or a staggered one). It exists apart from the
// Worker, as Running does, so that each of them can be built with it in
// its constructor, whatever the order the node opens them in. The zero
// value is not ready; use NewWakeup.
type Wakeup struct {
	mu      sync.Mutex
	pollers []*poller
}

// NewWakeup returns a Wakeup that wakes no loop until a Worker is built
// with it.
func NewWakeup() *Wakeup { return &Wakeup{} }

// Wake ends the idle wait of every poll loop of the Workers built with
// w: each polls at once and starts its idle backoff over. Loops that are
// not running yet poll at once when they start. It never blocks, and
// wakes that come while a loop is polling are one wake.
func (w *Wakeup) Wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.pollers {
		p.nudge()
	}
}

// add makes Wake wake ps.
func (w *Wakeup) add(ps ...*poller) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pollers = append(w.pollers, ps...)
}
