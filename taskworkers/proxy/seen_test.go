package proxy

import (
	"fmt"
	"testing"
	"time"
)

// TestSeenTasks_SweepDropsOnlyOldEntries: past seenSweepAt entries, a
// note drops those older than seenMaxAge and keeps the younger.
func TestSeenTasks_SweepDropsOnlyOldEntries(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	s := &seenTasks{nowFor: func() time.Time { return now }}
	for i := range seenSweepAt - 10 {
		s.note(fmt.Sprint("old", i), nil, nil)
	}
	now = t0.Add(seenMaxAge - time.Minute)
	for i := range 10 {
		s.note(fmt.Sprint("young", i), nil, nil)
	}
	now = t0.Add(seenMaxAge + time.Minute)
	s.note("last", nil, nil)
	if n := len(s.m); n != 11 {
		t.Fatalf("%d entries after the sweep, want the 11 younger than %s", n, seenMaxAge)
	}
}

// TestSeenTasks_NoteStaysCheapWhenFull: with seenSweepAt entries, all
// younger than seenMaxAge (a busy proxy: 100,000 tasks in two hours is 14
// a second), a note costs about what it costs on an empty map, not a
// read of every entry. Each side is the quickest of three rounds of 200
// notes; a read of every entry made the full side thousands of times
// slower.
func TestSeenTasks_NoteStaysCheapWhenFull(t *testing.T) {
	round := func(s *seenTasks, r int) time.Duration {
		began := time.Now()
		for i := range 200 {
			s.note(fmt.Sprint("r", r, "-", i), nil, nil)
		}
		return time.Since(began)
	}
	quickest := func(s *seenTasks) time.Duration {
		best := time.Hour
		for r := range 3 {
			best = min(best, round(s, r))
		}
		return best
	}
	full := &seenTasks{}
	for i := range seenSweepAt {
		full.note(fmt.Sprint(i), nil, nil)
	}
	empty := quickest(&seenTasks{})
	busy := quickest(full)
	if busy > 100*empty {
		t.Fatalf("200 notes took %s with %d young entries, %s with none: each note read the whole map", busy, seenSweepAt, empty)
	}
}
