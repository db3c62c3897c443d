package runlist_test

import (
	"context"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"

	"github.com/conductor-sidecar/sidecar/runlist"
)

// TestList_MirrorOfAStalledWatch: the server keeps the mirror's watch
// consumer but it delivers nothing (paused on the server here, as an
// overloaded server left one for good). A run started after that still
// reaches every reader of the list, once.
func TestList_MirrorOfAStalledWatch(t *testing.T) {
	f := newFixture(t)
	l := f.open(runlist.Options{})
	f.start("r1", "etl", nil)
	waitIndexed(t, l)
	ctx := context.Background()
	st, err := f.js.Stream(ctx, l.Streams()[0])
	if err != nil {
		t.Fatal(err)
	}
	paused := natstest.StallConsumers(t, st)
	if paused != 1 {
		t.Fatalf("paused %d consumers, want the mirror's one", paused)
	}
	f.start("r2", "etl", nil)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := l.WaitIndexed(wctx); err != nil {
		t.Fatalf("the list never showed the run started while its watch was stalled: %v", err)
	}
	page, err := l.List(runlist.Filter{}, 10, "")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range page.Runs {
		seen[r.RunID]++
	}
	if len(page.Runs) != 2 || seen["r1"] != 1 || seen["r2"] != 1 {
		t.Fatalf("rows %v, want r1 and r2 once each", seen)
	}
}
