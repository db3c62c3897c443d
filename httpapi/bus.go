package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/eventbus"
)

// Bus is the event bus as the API shows it; *eventbus.Bus satisfies it.
type Bus interface {
	Status(ctx context.Context) ([]eventbus.SinkStatus, error)
	// DeadLetters and Replay see only the dead letters keep accepts
	// (nil: all): the caller's scope.
	DeadLetters(ctx context.Context, sink, after string, limit int, keep func(*eventbus.DeadLetter) bool) ([]eventbus.DeadLetter, error)
	Replay(ctx context.Context, sink string, keys []string, keep func(*eventbus.DeadLetter) bool) ([]eventbus.ReplayResult, error)
}

// Limits of GET /v1/bus/deadletters.
const (
	DefaultDeadLetterLimit = 100
	MaxDeadLetterLimit     = 1000
)

// BusStatus is the answer of GET /v1/bus.
type BusStatus struct {
	Sinks []eventbus.SinkStatus `json:"sinks"`
}

// DeadLetterList is the answer of GET /v1/bus/deadletters; Next, when
// set, is the after= of the next page.
type DeadLetterList struct {
	DeadLetters []eventbus.DeadLetter `json:"deadLetters"`
	Next        string                `json:"next,omitempty"`
}

// ReplayRequest is the body of POST /v1/bus/deadletters:replay: the
// dead letters of sink to deliver again (keys; none: all of them).
type ReplayRequest struct {
	Sink string   `json:"sink"`
	Keys []string `json:"keys"`
}

// ReplayAnswer is its answer.
type ReplayAnswer struct {
	Results []eventbus.ReplayResult `json:"results"`
	Counts  map[string]int          `json:"counts"`
}

var replaySchema = plan.JSONObject(map[string]plan.Schema{"sink": plan.JSONString, "keys": plan.JSONStringList})

// inScope returns the dead letters a scoped principal may see and replay:
// those of runs in its scope, by the run's snapshot (its RunStarted), as
// for a run route; nil (all) without authentication or for an unscoped
// principal. A run the log cannot show is out of scope: fail closed.
func (s *Server) inScope(r *http.Request) func(*eventbus.DeadLetter) bool {
	p := PrincipalFrom(r.Context())
	if p == nil || p.Scope == (Scope{}) {
		return nil
	}
	seen := map[string]bool{}
	return func(dl *eventbus.DeadLetter) bool {
		ok, known := seen[dl.RunID]
		if !known {
			snap, err := s.opts.Log.ProjectSnapshot(r.Context(), dl.RunID)
			ok = err == nil && p.Scope.Allows(snap.TenantID, snap.ProjectID, snap.EnvironmentID)
			seen[dl.RunID] = ok
		}
		return ok
	}
}

// busStatus serves GET /v1/bus. The sinks' cursors and dead-letter counts
// cover every tenant's events: a scoped principal is refused.
func (s *Server) busStatus(w http.ResponseWriter, r *http.Request) error {
	if p := PrincipalFrom(r.Context()); p != nil && p.Scope != (Scope{}) {
		return &apiError{status: http.StatusForbidden, Code: CodeForbidden,
			Message: p.Name + " is scoped to a tenant, project or environment and the bus status covers every run; list your dead letters with GET /v1/bus/deadletters"}
	}
	sinks, err := s.opts.Bus.Status(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, BusStatus{Sinks: sinks})
}

func (s *Server) deadLetters(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit := DefaultDeadLetterLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxDeadLetterLimit {
			return badRequest("limit", "limit: 1 to "+strconv.Itoa(MaxDeadLetterLimit))
		}
		limit = n
	}
	if err := checkOptionalIDs(false, [2]string{"sink", q.Get("sink")}, [2]string{"after", q.Get("after")}); err != nil {
		return err
	}
	dls, err := s.opts.Bus.DeadLetters(r.Context(), q.Get("sink"), q.Get("after"), limit+1, s.inScope(r))
	if err != nil {
		return err
	}
	out := DeadLetterList{DeadLetters: dls}
	if len(dls) > limit {
		out.DeadLetters = dls[:limit]
		out.Next = dls[limit-1].Key
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) replay(w http.ResponseWriter, r *http.Request) error {
	var req ReplayRequest
	if err := decodeBody(r, replaySchema, &req); err != nil {
		return err
	}
	if req.Sink == "" {
		return badRequest("sink", "sink is required")
	}
	if err := checkID("sink", req.Sink, false); err != nil {
		return err
	}
	if len(req.Keys) > MaxDeadLetterLimit {
		return badRequest("keys", fmt.Sprintf("at most %d keys per replay (a page of dead letters); replay the rest in another", MaxDeadLetterLimit))
	}
	for i, k := range req.Keys {
		if err := checkID(fmt.Sprintf("keys[%d]", i), k, false); err != nil {
			return err
		}
	}
	res, err := s.opts.Bus.Replay(r.Context(), req.Sink, req.Keys, s.inScope(r))
	if err != nil {
		return err
	}
	out := ReplayAnswer{Results: res, Counts: map[string]int{}}
	for _, x := range res {
		out.Counts[x.Outcome]++
	}
	return writeJSON(w, http.StatusOK, out)
}
