package adapter

import (
	"fmt"
	"testing"
	"time"
)

// TestWatcher_RecheckIsBounded: Recheck asks for a run's read at most once
// per interval, and remembers at most maxRechecked runs: past that, runs
// asked for within the interval are left to the scans, and the memory
// stays bounded however many paused runs' tasks are polled.
func TestWatcher_RecheckIsBounded(t *testing.T) {
	w := &Watcher{opts: WatcherOptions{RecheckInterval: time.Hour}, nudgeCh: make(chan struct{}, 1),
		rechecks: map[string]struct{}{}, rechecked: map[string]time.Time{}}
	w.Recheck("r")
	w.Recheck("r")
	if got := w.takeRechecks(); len(got) != 1 {
		t.Fatalf("rechecks %v, want r once", got)
	}
	w.Recheck("r")
	if got := w.takeRechecks(); len(got) != 0 {
		t.Fatalf("rechecks %v within the interval, want none", got)
	}
	for i := range 2 * maxRechecked {
		w.Recheck(fmt.Sprint("run-", i))
	}
	if n, q := len(w.rechecked), len(w.takeRechecks()); n > maxRechecked || q != maxRechecked-1 {
		t.Fatalf("remembered %d runs, queued %d, want at most %d and %d", n, q, maxRechecked, maxRechecked-1)
	}
	w.opts.RecheckInterval = time.Nanosecond // the interval passed: the old ones are forgotten
	time.Sleep(time.Millisecond)
	w.Recheck("late")
	if got := w.takeRechecks(); len(got) != 1 || len(w.rechecked) != 1 {
		t.Fatalf("after the interval: queued %v, remembered %d, want late alone", got, len(w.rechecked))
	}
}
