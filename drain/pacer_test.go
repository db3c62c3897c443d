package drain

import (
	"fmt"
	"testing"
	"time"
)

// TestPacer_KeepsTheStaggersSpacing: entries are handed out at their
// times; entries that fell due long ago (a restart) are handed out one
// spacing apart from the first, not together; a batch keeps its shape; an
// entry handed out is not queued again by a read of the schedule made
// before it ended, but is after a failure (a retry); an empty queue ends
// the shift.
func TestPacer_KeepsTheStaggersSpacing(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 6, 0, 0, 0, time.UTC)
	entry := func(i int, at time.Time) ScheduledResume {
		return ScheduledResume{RunID: fmt.Sprintf("r%02d", i), Cycle: 1, At: at, RequestedBy: "bulk"}
	}
	// take hands out the next entry at now, failing unless it is due then
	// (and, when exact, not a moment before).
	take := func(p *pacer, now time.Time, want string, exact bool) {
		t.Helper()
		if exact {
			if e, wait, ok := p.takeDue(now.Add(-time.Millisecond)); ok && wait <= 0 {
				t.Fatalf("%s handed out at %v, before its due time %v", e.RunID, now.Add(-time.Millisecond).Sub(t0), now.Sub(t0))
			}
		}
		e, wait, ok := p.takeDue(now)
		if !ok || wait > 0 || e.RunID != want {
			t.Fatalf("at %v: got %q (wait %v, ok %v), want %s due", now.Sub(t0), e.RunID, wait, ok, want)
		}
	}

	// On time: each at its own time, 50 ms apart.
	p := newPacer()
	for i := range 5 {
		p.add(entry(i, t0.Add(time.Duration(i)*50*time.Millisecond)))
	}
	for i := range 5 {
		take(p, t0.Add(time.Duration(i)*50*time.Millisecond), fmt.Sprintf("r%02d", i), true)
	}

	// All due an hour ago (a restart): the first now, the others 50 ms
	// apart after it.
	p = newPacer()
	for i := range 5 {
		p.add(entry(i, t0.Add(time.Duration(i)*50*time.Millisecond)))
	}
	late := t0.Add(time.Hour)
	for i := range 5 {
		take(p, late.Add(time.Duration(i)*50*time.Millisecond), fmt.Sprintf("r%02d", i), i > 0)
	}
	// A read of the schedule made before those entries ended queues none
	// of them again.
	var stale []ScheduledResume
	for i := range 5 {
		stale = append(stale, entry(i, t0.Add(time.Duration(i)*50*time.Millisecond)))
	}
	p.sync(stale, func(string) bool { return true })
	if e, _, ok := p.takeDue(late.Add(200 * time.Millisecond)); ok {
		t.Fatalf("%s queued again by a stale read of the schedule", e.RunID)
	}
	// A retry of an entry handed out before: at once.
	p.untake("r00", 1)
	p.add(entry(0, t0))
	take(p, late.Add(200*time.Millisecond), "r00", false)
	// The queue ran empty: a new entry is due at its own time.
	if _, _, ok := p.takeDue(late.Add(time.Second)); ok {
		t.Fatal("the queue is not empty")
	}
	p.add(entry(9, late.Add(2*time.Second)))
	take(p, late.Add(2*time.Second), "r09", true)

	// A batch of 3 every second, found a minute late: 3 at once, a
	// second, 3 at once.
	p = newPacer()
	for i := range 6 {
		p.add(entry(i, t0.Add(time.Duration(i/3)*time.Second)))
	}
	late = t0.Add(time.Minute)
	for i := range 3 {
		take(p, late, fmt.Sprintf("r%02d", i), false)
	}
	for i := 3; i < 6; i++ {
		take(p, late.Add(time.Second), fmt.Sprintf("r%02d", i), i == 3)
	}
}
