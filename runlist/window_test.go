package runlist_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// TestList_FinishedWindow: a replica that keeps only the newest 3
// finished runs in memory lists, with every filter and page size, exactly
// what a replica that keeps them all lists, in the same order (the older
// finished runs read from the bucket); it holds the open runs and 3
// finished ones; and a listing paged through while new runs finish (the
// window moves past its position) shows every run once.
func TestList_FinishedWindow(t *testing.T) {
	f := newFixture(t)
	all := f.workload("run")
	ref := f.open(runlist.Options{})
	reg := prometheus.NewRegistry()
	small := f.open(runlist.Options{MaxFinished: 3, Owner: owner(false), Metrics: runlist.NewMetrics(reg)})
	waitIndexed(t, ref)
	waitIndexed(t, small)
	f.checkRows(small, all)

	open := 0
	for _, id := range all {
		if st, _, _, _ := f.truth(id); !statestore.IsTerminalRunStatus(st) {
			open++
		}
	}
	if got := testutil.ToFloat64(mustCollector(t, reg, "sidecar_runlist_rows")); got != float64(open+3) {
		t.Fatalf("the small replica holds %v rows, want the %d open runs and 3 finished", got, open)
	}

	sel, err := runlist.ParseSelector("tier in (gold,bronze)")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		filter runlist.Filter
	}{
		{"everything", runlist.Filter{}},
		{"plan", runlist.Filter{PlanID: "report"}},
		{"finished", runlist.Filter{Statuses: []string{"COMPLETED", "CANCELLED"}}},
		{"open", runlist.Filter{Statuses: []string{"RUNNING", "PAUSED"}}},
		{"completed or running", runlist.Filter{Statuses: []string{"COMPLETED", "RUNNING"}}},
		{"draining", runlist.Filter{Substatus: "DRAINING"}},
		{"selector", runlist.Filter{Selector: sel}},
		{"nothing", runlist.Filter{PlanID: "none"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := allRows(t, ref, c.filter, 0)
			for _, limit := range []int{0, 1, 2, 3, 7, 100} {
				got := allRows(t, small, c.filter, limit)
				if !slices.Equal(ids(got), ids(want)) {
					t.Fatalf("limit %d: the small replica lists %v, the full one %v", limit, ids(got), ids(want))
				}
				for i := range got {
					if got[i].Status != want[i].Status || got[i].LastEventSeq != want[i].LastEventSeq {
						t.Fatalf("limit %d: run %s is %s through %d, the full replica says %s through %d",
							limit, got[i].RunID, got[i].Status, got[i].LastEventSeq, want[i].Status, want[i].LastEventSeq)
					}
				}
			}
		})
	}

	// Page through while new runs finish: they move the window past the
	// listing's position; the listing still shows every run once.
	page, err := small.List(runlist.Filter{}, 4, "")
	if err != nil {
		t.Fatal(err)
	}
	seen := ids(page.Runs)
	for i := range 6 {
		id := fmt.Sprintf("new-%d", i)
		f.start(id, "report", nil)
		f.event(id, "report", statestore.RunCompleted, "", 1, nil)
	}
	waitIndexed(t, small)
	for cont := page.Continue; cont != ""; {
		p, err := small.List(runlist.Filter{}, 4, cont)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, ids(p.Runs)...)
		cont = p.Continue
	}
	wantIDs := slices.Clone(all)
	slices.Reverse(wantIDs)
	if !slices.Equal(seen, wantIDs) {
		t.Fatalf("paged through while runs finished: %v, want %v", seen, wantIDs)
	}
}

func mustCollector(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: "copy"}, func() float64 { return mf.GetMetric()[0].GetGauge().GetValue() })
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}
