package admission_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/admission"
)

// hiding is the run list with some runs left out, as retention leaves out
// a run it removed: the list never shows them.
type hiding struct {
	admission.ActiveRuns
	mu  sync.Mutex
	ids map[string]bool
}

func (h *hiding) hide(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids[id] = true
}

func (h *hiding) ShowsStarted(id string) bool {
	h.mu.Lock()
	hidden := h.ids[id]
	h.mu.Unlock()
	return !hidden && h.ActiveRuns.ShowsStarted(id)
}

func (h *hiding) ActiveCounts() (int, map[string]int, map[[2]string]int, bool) {
	return h.ActiveRuns.ActiveCounts() // a hidden run is not counted: it is not in the list
}

// A run the decider started that ends and leaves the list before the
// decider saw it there (retention removed it within seconds) stops
// counting once the log says it ended: another run of its tenant starts.
// Before, it counted as active for two minutes, and the next run of its
// tenant waited that long with a free place.
func TestAdmission_ARunThatEndedUnseenStopsCounting(t *testing.T) {
	e := newEnv(t)
	h := &hiding{ids: map[string]bool{}}
	h.ActiveRuns = e.list
	c := e.open(admission.Options{Limits: admission.Limits{PerTenant: 1}, Policy: admission.Queue, Wait: 2 * time.Second, Active: h})
	defer c.Close(context.Background())
	// The first run is hidden before it is submitted: the list never
	// shows it, as if removed at once.
	runID, err := e.runs.RunIDFor(context.Background(), e.request("t1", "ph-1"))
	if err != nil {
		t.Fatal(err)
	}
	h.hide(runID)
	first, err := e.submit(c, "t1", "ph-1")
	if err != nil || first.Started == nil {
		t.Fatalf("first: %+v %v", first, err)
	}
	e.end(first.RunID)
	second, err := e.submit(c, "t1", "ph-2")
	if err != nil {
		t.Fatal(err)
	}
	if second.Started == nil {
		e.waitStarted(second.RunID)
	}
}
