package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// projections counts the run projections a request costs.
type projections struct {
	*memstore.Store
	n atomic.Int64
}

func (p *projections) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	p.n.Add(1)
	return p.Store.ProjectSnapshot(ctx, runID)
}

// appender appends straight to the store (the registry protocol is tested
// in package registry).
type appender struct{ s *memstore.Store }

func (a appender) Emit(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	w.EventID = uuid.NewString()
	return a.s.Append(ctx, w)
}

func (a appender) EmitIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	w.EventID = uuid.NewString()
	return a.s.AppendIf(ctx, w, lastSeq)
}

// pausedWorkflows is Conductor's side of the test: it records the
// workflows paused (the real Conductor is in the end-to-end tests).
type pausedWorkflows struct{ paused []string }

func (e *pausedWorkflows) Pause(_ context.Context, wf string) error {
	e.paused = append(e.paused, wf)
	return nil
}
func (e *pausedWorkflows) Resume(context.Context, string) error            { return nil }
func (e *pausedWorkflows) Terminate(context.Context, string, string) error { return nil }

// TestServer_PauseAnswersFromTheDrainState: POST :pause is answered from
// the State the drain controller returned, which found the run's workflow
// in its RunStarted: the API reads the run no more, and the pause costs
// the controller's own reads (the decision, the settle that is also the
// answer; the end of an empty drain decides on the run as RunPaused left
// it, without a read).
func TestServer_PauseAnswersFromTheDrainState(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []string
		reads int64
	}{{"NothingInFlight", nil, 2}, {"Draining", []string{"a"}, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			mem := memstore.New(statestore.ProjectorOptions{})
			mem.Append(ctx, storetest.WithPayload(storetest.Event("r", statestore.RunStarted, ""),
				map[string]any{"engineRunRef": statestore.ConductorRunRef("plan", "wf1"), "engineType": "conductor"}))
			for _, s := range tc.steps {
				mem.Append(ctx, storetest.Event("r", statestore.StepStarted, s))
			}
			reads := &projections{Store: mem}
			eng := &pausedWorkflows{}
			ctrl := drain.New(reads, appender{mem}, eng, drain.Options{})
			srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: reads, Control: ctrl}).Handler())
			defer srv.Close()
			resp, err := http.Post(srv.URL+"/v1/runs/r/pause", "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var view httpapi.RunView
			if err := json.NewDecoder(resp.Body).Decode(&view); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("pause: %d %v", resp.StatusCode, err)
			}
			if view.Status != statestore.RunStatusPaused || view.Drain == nil || view.Drain.Cycle != 1 || view.Drain.Draining != (len(tc.steps) > 0) {
				t.Fatalf("answer %+v drain %+v, want PAUSED in cycle 1", view.RunSnapshot, view.Drain)
			}
			if len(eng.paused) != 1 || eng.paused[0] != "wf1" {
				t.Fatalf("Conductor paused %v, want [wf1] (the RunStarted's workflow)", eng.paused)
			}
			if got := reads.n.Load(); got != tc.reads {
				t.Fatalf("one pause read the run %d times, want %d", got, tc.reads)
			}
		})
	}
}
