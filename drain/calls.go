package drain

import (
	"hash/fnv"
	"sync"
)

// callSlots is how many generation counters Calls keeps: a run's
// generation is its slot's, so memory stays fixed whatever the number of
// runs (a request on another run of the same slot only defers a decision
// to the next check).
const callSlots = 256

// Calls tracks, per run, the Controller's pause, resume and cancel requests under
// way in this process: from the moment a request starts until its settle
// has read the log after its last call to Conductor. While one is under
// way, a call of it may still reach Conductor after a later request's,
// so what Conductor shows of the run is nobody's action yet. The Follower
// asks it before it puts a difference down to Conductor. One Calls is
// shared by a process's Controller and Follower (NewCalls, then
// Options.Calls and FollowerOptions.Calls).
type Calls struct {
	mu   sync.Mutex
	runs map[string]int // requests under way per run
	gens [callSlots]uint64
}

// NewCalls returns an empty Calls.
func NewCalls() *Calls { return &Calls{runs: map[string]int{}} }

// InFlight reports whether a pause, resume or cancel of runID is under way, and
// a generation that changes whenever one starts or ends: two answers
// with the same generation, the first with nothing under way, mean that
// no request on the run ran in between.
func (c *Calls) InFlight(runID string) (busy bool, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[runID] > 0, c.gens[callSlot(runID)]
}

// begin marks a request on runIDs under way; the returned func ends it.
func (c *Calls) begin(runIDs ...string) (end func()) {
	c.mu.Lock()
	for _, id := range runIDs {
		c.runs[id]++
		c.gens[callSlot(id)]++
	}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, id := range runIDs {
			if c.runs[id]--; c.runs[id] <= 0 {
				delete(c.runs, id)
			}
			c.gens[callSlot(id)]++
		}
	}
}

func callSlot(runID string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(runID))
	return int(h.Sum32() % callSlots)
}
