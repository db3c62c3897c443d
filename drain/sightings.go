package drain

import (
	"context"
	"sync"
	"time"
)

// DefaultGrace is how long a difference between Conductor and the log
// must last before a Follower that may not be alone puts it down to an
// action in Conductor (FollowerOptions.Grace): twice the Conductor
// client's call timeout (10 s, adapter.DefaultTimeout) plus 10 s for the
// ledger note and the log re-read in between. Another replica's late
// call lands within one call timeout of being sent, and that request's
// settle sends its correction within the note and re-read after the late
// call's answer, which lands within one call timeout more: no difference
// such a call leaves lasts that long.
const DefaultGrace = 30 * time.Second

// GraceFor is the grace for a Conductor client whose pause and resume
// calls last at most longestCall (adapter.Client.LongestPauseCall): a late
// call lands within longestCall of being sent, its request's correction
// is sent within 10 s (the ledger note and the log's re-read) of its
// answer and lands within longestCall more. DefaultGrace is GraceFor of a
// client whose calls last 10 s.
func GraceFor(longestCall time.Duration) time.Duration {
	return 2*longestCall + 10*time.Second
}

// DefaultMaxSightings is how many runs' differences a Follower remembers
// at most (FollowerOptions.MaxSightings).
const DefaultMaxSightings = 4096

// sightingTTL is how old a remembered difference must be before a full
// Follower drops it to remember another: a run that ended or left this
// replica is never checked again, and its entry must not hold the room
// for good.
const sightingTTL = 15 * time.Minute

// sweepEvery is how often at most a full Follower looks for entries
// older than sightingTTL: the look reads every entry.
const sweepEvery = time.Minute

// RevisionLedger is an engine ledger that also tells the revision of a
// run's note, which changes with every note written (Keys implements
// it). With it, a difference is only put down to Conductor when no note
// at all was written between the two checks that saw it; without it, when
// the note's state is the same.
type RevisionLedger interface {
	EngineRevision(ctx context.Context, runID string) (paused bool, cycle int64, rev uint64, err error)
}

// sighting is what a check saw when Conductor's workflow and the log
// differed with the engine ledger holding the log's state.
type sighting struct {
	logCycle    int64
	logPaused   bool
	noteRev     uint64
	notePaused  bool
	noteCycle   int64
	enginePause bool
	first       time.Time // when a check first saw it
}

func (s sighting) same(o sighting) bool {
	return s.logCycle == o.logCycle && s.logPaused == o.logPaused && s.noteRev == o.noteRev &&
		s.notePaused == o.notePaused && s.noteCycle == o.noteCycle && s.enginePause == o.enginePause
}

// sightings remembers, per run, the difference a check saw first, so that
// a later check decides only on one that lasted the grace. Its size is
// fixed (max): when full, entries older than sightingTTL go (looked for
// at most every sweepEvery); when none can, a new difference is not
// remembered and is decided at a later check, once there is room.
// Forgetting only ever delays a decision.
type sightings struct {
	mu    sync.Mutex
	runs  map[string]sighting
	max   int
	swept time.Time // the last look for entries to drop
}

// lasted reports whether s, seen now, was seen at a check at least grace
// before, with nothing else seen of the run in between; else it remembers
// s (when there is room) and the run is decided at a later check.
func (t *sightings) lasted(runID string, s sighting, now time.Time, grace time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	prev, ok := t.runs[runID]
	if ok && prev.same(s) {
		if now.Sub(prev.first) < grace {
			return false
		}
		delete(t.runs, runID)
		return true
	}
	if !ok && len(t.runs) >= t.max && now.Sub(t.swept) >= sweepEvery {
		t.swept = now
		for id, old := range t.runs {
			if now.Sub(old.first) > sightingTTL {
				delete(t.runs, id)
			}
		}
	}
	if !ok && len(t.runs) >= t.max {
		return false // not remembered: decided at a later check
	}
	s.first = now
	t.runs[runID] = s
	return false
}

// forget drops runID's remembered difference: the run is in step, ended,
// or its difference is the sidecar's own to converge.
func (t *sightings) forget(runID string) {
	t.mu.Lock()
	delete(t.runs, runID)
	t.mu.Unlock()
}
