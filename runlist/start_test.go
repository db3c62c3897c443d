package runlist_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestList_StartReadsWhatIsOpen: a replica that starts on a bucket of 60
// finished runs and 3 open ones (the oldest, their rows written first)
// reads the open runs' rows and about the newest finished ones, not every
// row, and still lists exactly what a replica that read every row lists,
// on every page, and follows what happens next.
func TestList_StartReadsWhatIsOpen(t *testing.T) {
	f := newFixture(t)
	ref := f.open(runlist.Options{})
	var open []string
	for i := range 3 {
		id := fmt.Sprintf("open-%d", i)
		f.start(id, "report", map[string]string{"tier": "gold"})
		open = append(open, id)
	}
	// One run at a time, so that the rows are written in the order the
	// runs finish, as they are in a list that keeps up with the log (the
	// rows of one batch of the follower are written in any order).
	for i := range 60 {
		id := fmt.Sprintf("done-%02d", i)
		f.start(id, "report", map[string]string{"tier": "bronze"})
		f.event(id, "report", statestore.RunCompleted, "", 1, nil)
		waitIndexed(t, ref)
	}
	const window = 5
	// The replica that keeps the list, with the same window.
	f.open(runlist.Options{MaxFinished: window})

	// Replicas start one after another; a start after the list settled
	// reads few rows.
	deadline := time.Now().Add(time.Minute)
	var started *runlist.List
	var read float64
	for {
		reg := prometheus.NewRegistry()
		l := f.open(runlist.Options{MaxFinished: window, Metrics: runlist.NewMetrics(reg)})
		waitIndexed(t, l)
		read = testutil.ToFloat64(mustCollector(t, reg, "sidecar_runlist_start_rows_read"))
		if read <= 3*window {
			started = l
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a replica that keeps %d finished runs read %v rows at start; want at most %d (3 open runs, the newest finished ones)", window, read, 3*window)
		}
		_ = l.Close(context.Background())
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("rows read at start: %v of 63", read)

	check := func(what string) {
		t.Helper()
		for _, flt := range []runlist.Filter{{}, {Statuses: []string{"RUNNING"}}, {Statuses: []string{"COMPLETED"}}} {
			want := allRows(t, ref, flt, 0)
			for _, limit := range []int{0, 1, 4, 7, 100} {
				got := allRows(t, started, flt, limit)
				if !slices.Equal(ids(got), ids(want)) {
					t.Fatalf("%s, statuses %v, limit %d: the replica lists %v, one that read every row %v", what, flt.Statuses, limit, ids(got), ids(want))
				}
			}
		}
	}
	check("after the start")

	// What happens next reaches it: an old open run ends, a new one starts.
	f.event(open[0], "report", statestore.RunCompleted, "", 1, nil)
	f.start("later", "report", nil)
	waitIndexed(t, ref)
	waitIndexed(t, started)
	check("after new events")
}
