package httpapi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/conductor-sidecar/sidecar/adapter/plan"
	"github.com/conductor-sidecar/sidecar/drain"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/tracing"
)

// Bulk actions: POST /v1/runs:pause, /v1/runs:resume, /v1/runs:cancel.
const (
	// MaxBulkRuns bounds the runs one bulk action selects; a larger
	// selection is refused (BULK_TOO_LARGE), nothing done.
	MaxBulkRuns = 10000
	// bulkRounds is how many times a bulk action selects again, after
	// acting, to take in the runs that started while it acted.
	bulkRounds = 3
	// bulkWorkers is how many runs a bulk action acts on at once.
	bulkWorkers = 8
	// bulkSelectWait bounds the wait for the run list before a bulk
	// action's first selection; bulkCatchUpWait the wait after acting,
	// while the list takes in the action's own events.
	bulkSelectWait  = 10 * time.Second
	bulkCatchUpWait = 2 * time.Minute
	// CodeBulkTooLarge: the selection holds more than MaxBulkRuns runs.
	CodeBulkTooLarge = "BULK_TOO_LARGE"
)

// Outcomes of a run in a bulk action's answer.
const (
	OutcomePaused            = "paused"
	OutcomeAlreadyPaused     = "already_paused"
	OutcomeResumed           = "resumed"
	OutcomeScheduled         = "scheduled" // a staggered resume, due at resumeAt
	OutcomeCancelled         = "cancelled"
	OutcomeInvalidTransition = "invalid_transition"
	OutcomeNotFound          = "not_found"
	OutcomeFailed            = "failed" // error says why; the action may be repeated
	// OutcomeStartedDuring: the run started while the action ran, after
	// its last selection; it was not acted on.
	OutcomeStartedDuring = "started_during"
	// OutcomeWould is the outcome of every run of a dry run.
	OutcomeWould = "would_act"
	// OutcomeQueued: a pause's run waiting for admission (QUEUED). It has
	// no workflow to pause: it is not paused, and starts when capacity
	// frees; cancel it to keep it from starting.
	OutcomeQueued = "queued"
)

// BulkRequest is the body of a bulk action.
type BulkRequest struct {
	LabelSelector string `json:"labelSelector,omitempty"`
	PlanID        string `json:"planId,omitempty"`
	PlanVersion   string `json:"planVersion,omitempty"`
	TenantID      string `json:"tenantId,omitempty"`
	ProjectID     string `json:"projectId,omitempty"`
	EnvironmentID string `json:"environmentId,omitempty"`
	// All must be true to act without any of the filters above.
	All bool `json:"all,omitempty"`
	// RunIDs, when set, narrows the selection to these runs (each must
	// still match the filters): the runs a dry run listed, so that the
	// action touches no run that began to match since (the console's
	// confirmation sends them). At most MaxBulkRuns.
	RunIDs []string `json:"runIds,omitempty"`
	// Reason is required; it is recorded in every run's event.
	Reason      string `json:"reason"`
	RequestedBy string `json:"requestedBy,omitempty"`
	DryRun      bool   `json:"dryRun,omitempty"`
	// Pause only: as a single pause's.
	TimeoutSeconds     int64  `json:"timeoutSeconds,omitempty"`
	ResumeAt           string `json:"resumeAt,omitempty"`
	ResumeAfterSeconds int64  `json:"resumeAfterSeconds,omitempty"`
	// Resume only: the stagger, MaxPerSecond or Batch with IntervalSeconds.
	MaxPerSecond    float64 `json:"maxPerSecond,omitempty"`
	Batch           int64   `json:"batch,omitempty"`
	IntervalSeconds int64   `json:"intervalSeconds,omitempty"`
}

var bulkSchema = plan.JSONObject(map[string]plan.Schema{
	"labelSelector": plan.JSONString, "planId": plan.JSONString, "planVersion": plan.JSONString,
	"tenantId": plan.JSONString, "projectId": plan.JSONString, "environmentId": plan.JSONString,
	"all": plan.JSONBool, "runIds": plan.JSONStringList, "reason": plan.JSONString, "requestedBy": plan.JSONString, "dryRun": plan.JSONBool,
	"timeoutSeconds": plan.JSONInt, "resumeAt": plan.JSONString, "resumeAfterSeconds": plan.JSONInt,
	"maxPerSecond": plan.JSONNumber, "batch": plan.JSONInt, "intervalSeconds": plan.JSONInt,
})

// BulkResult is the answer of a bulk action.
type BulkResult struct {
	Action string `json:"action"`
	DryRun bool   `json:"dryRun"`
	// Runs holds every run selected, with its outcome, ordered by runId.
	Runs []BulkRun `json:"runs"`
	// Counts counts the runs by outcome.
	Counts map[string]int `json:"counts"`
	// IndexedThrough is the log position the last selection included.
	IndexedThrough uint64 `json:"indexedThrough"`
}

// BulkRun is one run of a bulk action.
type BulkRun struct {
	RunID   string `json:"runId"`
	PlanID  string `json:"planId"`
	Outcome string `json:"outcome"`
	// Status is the run's status when it was selected (and Substatus).
	Status    string `json:"status"`
	Substatus string `json:"substatus,omitempty"`
	// InFlightStepIDs: in a dry run of a pause, the steps the drain
	// would wait for.
	InFlightStepIDs []string `json:"inFlightStepIds,omitempty"`
	// ResumeAt is when a staggered resume resumes the run.
	ResumeAt string `json:"resumeAt,omitempty"`
	// Error says why a run failed (its code and message).
	Error *BulkError `json:"error,omitempty"`
}

// BulkError is a run's error in a bulk action.
type BulkError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// BulkControl acts on many runs at once (drain.Controller): each run as
// the single action would, with Conductor's side in bulk. A Control that
// has it carries out the bulk actions through it, except a staggered
// resume.
type BulkControl interface {
	PauseMany(ctx context.Context, runIDs []string, req drain.PauseRequest) []drain.Outcome
	ResumeMany(ctx context.Context, runIDs []string, req drain.ResumeRequest) []drain.Outcome
	CancelMany(ctx context.Context, runIDs []string, reason, requestedBy string) []drain.Outcome
}

// bulkAction is what a bulk action does: one run at a time (op), or all
// the runs of a selection at once (many, when set).
type bulkAction struct {
	op   func(ctx context.Context, i int, row *runlist.Row, dry bool) BulkRun
	many func(ctx context.Context, rows []runlist.Row) []BulkRun
}

// bulkStatuses are the statuses a bulk action selects.
var bulkStatuses = map[string][]string{
	"pause":  {statestore.RunStatusRunning, statestore.RunStatusPaused, statestore.RunStatusQueued}, // queued: answered, not acted on
	"resume": {statestore.RunStatusPaused},
	"cancel": {statestore.RunStatusPending, statestore.RunStatusQueued, statestore.RunStatusApproved, statestore.RunStatusRunning, statestore.RunStatusPaused},
}

// bulk serves POST /v1/runs:<action>: the runs the filter selects (in
// the statuses the action applies to) are acted on, each as a single
// request would, and the answer lists every run's outcome. A dry run
// selects and answers, writing nothing. The selection is made once the
// run list includes every event persisted before the request, and made
// again after acting, up to three times, so that a run that started
// meanwhile is acted on too, or listed as started_during.
func (s *Server) bulk(action string) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.opts.Control == nil || s.opts.List == nil {
			return &apiError{status: http.StatusServiceUnavailable, Code: CodeNotReady, Message: "this sidecar does not control runs"}
		}
		var body BulkRequest
		if err := decodeBody(r, bulkSchema, &body); err != nil {
			return err
		}
		f, inScope, err := bulkFilter(r, &body)
		if err != nil {
			return err
		}
		f.Statuses = bulkStatuses[action]
		act, err := s.bulkOp(r, action, &body)
		if err != nil {
			return err
		}
		only, err := bulkRunIDs(body.RunIDs)
		if err != nil {
			return err
		}
		res := &BulkResult{Action: action, DryRun: body.DryRun, Runs: []BulkRun{}, Counts: map[string]int{}}
		if inScope {
			if err := s.runBulk(r.Context(), f, only, act, body.DryRun, res); err != nil {
				return err
			}
		}
		sort.Slice(res.Runs, func(i, j int) bool { return res.Runs[i].RunID < res.Runs[j].RunID })
		var acted []string
		for _, run := range res.Runs {
			res.Counts[run.Outcome]++
			switch run.Outcome {
			case OutcomePaused, OutcomeResumed, OutcomeScheduled, OutcomeCancelled:
				acted = append(acted, run.RunID)
			}
		}
		tracing.RequestFrom(r.Context()).ActedOn(acted)
		return writeJSON(w, http.StatusOK, res)
	}
}

// bulkRunIDs is the set of a body's runIds (nil: none given, every run the
// filters select).
func bulkRunIDs(ids []string) (map[string]bool, error) {
	if ids == nil {
		return nil, nil
	}
	if len(ids) == 0 || len(ids) > MaxBulkRuns {
		return nil, badRequest("runIds", fmt.Sprintf("runIds names 1 to %d runs (%d given); leave it out to act on every run the filters select", MaxBulkRuns, len(ids)))
	}
	only := make(map[string]bool, len(ids))
	for i, id := range ids {
		if err := statestore.CheckID(id, true); err != nil {
			return nil, badRequest("runIds", fmt.Sprintf("runIds[%d]: %v", i, err))
		}
		only[id] = true
	}
	return only, nil
}

// bulkFilter is the body's filter with the caller's scope added; a filter
// outside the scope selects nothing (inScope false).
func bulkFilter(r *http.Request, b *BulkRequest) (f runlist.Filter, inScope bool, err error) {
	switch {
	case b.Reason == "" && !b.DryRun:
		return f, false, badRequest("reason", "a bulk action needs a reason (it is recorded in every run's event); a dry run needs none")
	case b.Reason != "":
		if err := checkReason(b.Reason); err != nil {
			return f, false, err
		}
	}
	none := b.LabelSelector == "" && b.PlanID == "" && b.PlanVersion == "" && b.TenantID == "" && b.ProjectID == "" && b.EnvironmentID == ""
	if none && !b.All {
		return f, false, badRequest("all", "no filter (labelSelector, planId, planVersion, tenantId, projectId, environmentId): set all to true to act on every run")
	}
	q := map[string][]string{"labelSelector": {b.LabelSelector}, "planId": {b.PlanID}, "planVersion": {b.PlanVersion},
		"tenantId": {b.TenantID}, "projectId": {b.ProjectID}, "environmentId": {b.EnvironmentID}}
	return listFilter(r, q)
}

// bulkOp checks the action's own fields and returns what to do to one run
// (i is its place in the selection, for a stagger), and to all of them at
// once when the Control has BulkControl.
func (s *Server) bulkOp(r *http.Request, action string, b *BulkRequest) (bulkAction, error) {
	op, err := s.bulkOne(r, action, b)
	if err != nil {
		return bulkAction{}, err
	}
	act := bulkAction{op: op}
	bc, ok := s.opts.Control.(BulkControl)
	if !ok {
		return act, nil
	}
	by, _ := requestedBy(r.Context(), b.RequestedBy) // checked by bulkOne
	switch action {
	case "pause":
		pb := pauseBody{ResumeAt: b.ResumeAt, ResumeAfterSeconds: b.ResumeAfterSeconds}
		resumeAt, _ := pb.resumeTime(time.Now()) // checked by bulkOne
		req := drain.PauseRequest{TimeoutSeconds: b.TimeoutSeconds, Reason: b.Reason, RequestedBy: by, ResumeAt: resumeAt}
		act.many = func(ctx context.Context, rows []runlist.Row) []BulkRun {
			out := make([]BulkRun, len(rows))
			var ids []string
			var at []int
			for i := range rows {
				switch rows[i].Status {
				case statestore.RunStatusPaused:
					out[i] = BulkRun{Outcome: OutcomeAlreadyPaused}
					continue
				case statestore.RunStatusQueued:
					out[i] = BulkRun{Outcome: OutcomeQueued}
					continue
				}
				ids, at = append(ids, rows[i].RunID), append(at, i)
			}
			for k, o := range bc.PauseMany(ctx, ids, req) {
				out[at[k]] = pauseOutcome(o.State, o.Err)
			}
			return out
		}
	case "resume":
		if b.MaxPerSecond != 0 || b.Batch != 0 || b.IntervalSeconds != 0 {
			return act, nil // staggered: one run at a time, each at its time
		}
		req := drain.ResumeRequest{Reason: b.Reason, RequestedBy: by}
		act.many = func(ctx context.Context, rows []runlist.Row) []BulkRun {
			return outcomes(bc.ResumeMany(ctx, rowIDs(rows), req), OutcomeResumed)
		}
	default: // cancel
		act.many = func(ctx context.Context, rows []runlist.Row) []BulkRun {
			return outcomes(bc.CancelMany(ctx, rowIDs(rows), b.Reason, by), OutcomeCancelled)
		}
	}
	return act, nil
}

// pauseOutcome is a run's outcome of a bulk pause: already_paused when the
// log showed it paused by the time its pause was decided (the list the
// selection read can be behind, or a concurrent request paused it first),
// so that only the request that recorded a run's pause answers paused.
func pauseOutcome(st *drain.State, err error) BulkRun {
	if err == nil && st != nil && st.AlreadyPaused {
		return BulkRun{Outcome: OutcomeAlreadyPaused}
	}
	return bulkOutcome(err, OutcomePaused)
}

func rowIDs(rows []runlist.Row) []string {
	ids := make([]string, len(rows))
	for i := range rows {
		ids[i] = rows[i].RunID
	}
	return ids
}

func outcomes(os []drain.Outcome, ok string) []BulkRun {
	out := make([]BulkRun, len(os))
	for i, o := range os {
		out[i] = bulkOutcome(o.Err, ok)
	}
	return out
}

// bulkOne checks the action's own fields and returns what to do to one
// run (i is its place in the selection, for a stagger).
func (s *Server) bulkOne(r *http.Request, action string, b *BulkRequest) (func(ctx context.Context, i int, row *runlist.Row, dry bool) BulkRun, error) {
	by, err := requestedBy(r.Context(), b.RequestedBy)
	if err != nil {
		return nil, err
	}
	if action != "pause" && (b.TimeoutSeconds != 0 || b.ResumeAt != "" || b.ResumeAfterSeconds != 0) {
		return nil, badRequest("timeoutSeconds", "timeoutSeconds, resumeAt and resumeAfterSeconds are a pause's")
	}
	if action != "resume" && (b.MaxPerSecond != 0 || b.Batch != 0 || b.IntervalSeconds != 0) {
		return nil, badRequest("maxPerSecond", "maxPerSecond, batch and intervalSeconds stagger a resume")
	}
	ctl := s.opts.Control
	switch action {
	case "pause":
		if t := b.TimeoutSeconds; t != 0 && (t < 1 || t > int64(MaxPauseTimeout/time.Second)) {
			return nil, badRequest("timeoutSeconds", fmt.Sprintf("timeoutSeconds must be 1..%d (7 days), or left out for the default", int64(MaxPauseTimeout/time.Second)))
		}
		pb := pauseBody{ResumeAt: b.ResumeAt, ResumeAfterSeconds: b.ResumeAfterSeconds}
		resumeAt, err := pb.resumeTime(time.Now())
		if err != nil {
			return nil, err
		}
		req := drain.PauseRequest{TimeoutSeconds: b.TimeoutSeconds, Reason: b.Reason, RequestedBy: by, ResumeAt: resumeAt}
		return func(ctx context.Context, _ int, row *runlist.Row, dry bool) BulkRun {
			switch row.Status {
			case statestore.RunStatusPaused:
				return BulkRun{Outcome: OutcomeAlreadyPaused}
			case statestore.RunStatusQueued:
				return BulkRun{Outcome: OutcomeQueued}
			}
			if dry {
				return BulkRun{Outcome: OutcomeWould}
			}
			return pauseOutcome(ctl.Pause(ctx, row.RunID, req))
		}, nil
	case "resume":
		at, err := stagger(b, time.Now())
		if err != nil {
			return nil, err
		}
		req := drain.ResumeRequest{Reason: b.Reason, RequestedBy: by}
		return func(ctx context.Context, i int, row *runlist.Row, dry bool) BulkRun {
			when := at(i)
			if dry {
				out := BulkRun{Outcome: OutcomeWould}
				if !when.IsZero() {
					out.ResumeAt = when.UTC().Format(time.RFC3339Nano)
				}
				return out
			}
			if when.IsZero() {
				_, err := ctl.Resume(ctx, row.RunID, req)
				return bulkOutcome(err, OutcomeResumed)
			}
			_, err := ctl.ResumeLater(ctx, row.RunID, when, req)
			out := bulkOutcome(err, OutcomeScheduled)
			if out.Outcome == OutcomeScheduled {
				out.ResumeAt = when.UTC().Format(time.RFC3339Nano)
			}
			return out
		}, nil
	default: // cancel
		return func(ctx context.Context, _ int, row *runlist.Row, dry bool) BulkRun {
			if dry {
				return BulkRun{Outcome: OutcomeWould}
			}
			_, err := ctl.Cancel(ctx, row.RunID, b.Reason, by)
			return bulkOutcome(err, OutcomeCancelled)
		}, nil
	}
}

// stagger returns when the i-th run of a resume is resumed: the zero time
// for now, else a time for ResumeLater.
func stagger(b *BulkRequest, now time.Time) (func(i int) time.Time, error) {
	switch {
	case b.MaxPerSecond != 0 && (b.Batch != 0 || b.IntervalSeconds != 0):
		return nil, badRequest("maxPerSecond", "give maxPerSecond, or batch with intervalSeconds, not both")
	case b.MaxPerSecond != 0:
		if b.MaxPerSecond < 0.001 || b.MaxPerSecond > 10000 || math.IsNaN(b.MaxPerSecond) {
			return nil, badRequest("maxPerSecond", "maxPerSecond must be 0.001..10000")
		}
		return func(i int) time.Time {
			if i == 0 {
				return time.Time{}
			}
			return now.Add(time.Duration(float64(i) / b.MaxPerSecond * float64(time.Second)))
		}, nil
	case b.Batch != 0 || b.IntervalSeconds != 0:
		if b.Batch < 1 || b.IntervalSeconds < 1 || b.IntervalSeconds > int64(MaxScheduledResume/time.Second) {
			return nil, badRequest("batch", "batch and intervalSeconds go together, each at least 1")
		}
		return func(i int) time.Time {
			k := int64(i) / b.Batch
			if k == 0 {
				return time.Time{}
			}
			return now.Add(time.Duration(k*b.IntervalSeconds) * time.Second)
		}, nil
	}
	return func(int) time.Time { return time.Time{} }, nil
}

// bulkOutcome maps an action's error to a run's outcome.
func bulkOutcome(err error, ok string) BulkRun {
	var ee *drain.EngineError
	switch {
	case err == nil, errors.As(err, &ee):
		// Recorded; Conductor's side is retried by the watcher as for a
		// single request.
		return BulkRun{Outcome: ok}
	case errors.Is(err, statestore.ErrInvalidTransition):
		return BulkRun{Outcome: OutcomeInvalidTransition, Error: bulkError(err)}
	case errors.Is(err, drain.ErrRunNotFound):
		return BulkRun{Outcome: OutcomeNotFound}
	}
	return BulkRun{Outcome: OutcomeFailed, Error: bulkError(err)}
}

func bulkError(err error) *BulkError {
	var se *statestore.Error
	if errors.As(err, &se) {
		return &BulkError{Code: se.Code, Message: se.Message}
	}
	return &BulkError{Code: CodeInternal, Message: err.Error()}
}

// runBulk selects and acts, in rounds, filling res; with only (runIds),
// it selects none but those runs, so no round finds a run that started
// meanwhile.
func (s *Server) runBulk(ctx context.Context, f runlist.Filter, only map[string]bool, act bulkAction, dryRun bool, res *BulkResult) error {
	op := act.op
	done := map[string]bool{}
	placed := 0 // runs acted on so far: the stagger's position
	for round := 0; ; round++ {
		// Before acting the list must answer within bulkSelectWait, else
		// nothing is done. After acting it takes in the action's own
		// events (two or three per run) before it can show the runs that
		// started meanwhile: that is work under way, waited for up to
		// bulkCatchUpWait, so that the outcomes are not lost.
		wait, what := bulkSelectWait, "nothing was done"
		if round > 0 {
			wait = bulkCatchUpWait
			failed := 0
			for _, o := range res.Runs {
				if o.Error != nil {
					failed++
				}
			}
			what = fmt.Sprintf("%d of the %d runs selected were acted on (%d failed); repeat the request to see each one's outcome (those acted on answer as already done) and to act on runs that started meanwhile",
				len(res.Runs)-failed, len(res.Runs), failed)
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		through, err := s.opts.List.WaitIndexed(wctx)
		cancel()
		var se *statestore.Error
		switch {
		case errors.Is(err, runlist.ErrUnavailable) && errors.As(err, &se):
			// The log cannot be read: the store's own fault, not a list
			// behind it.
			return &apiError{status: http.StatusServiceUnavailable, Code: se.Code,
				Message: fmt.Sprintf("the log cannot be read now; %s: %v", what, err), retryAfter: time.Second}
		case err != nil:
			return &apiError{status: http.StatusServiceUnavailable, Code: runlist.CodeSyncing,
				Message: fmt.Sprintf("the run list did not catch up with the log in %s; %s: %v", wait, what, err), retryAfter: time.Second}
		}
		res.IndexedThrough = through
		page, err := s.opts.List.List(f, 0, "")
		if err != nil {
			return err
		}
		var todo []runlist.Row
		for _, row := range page.Runs {
			if !done[row.RunID] && (only == nil || only[row.RunID]) {
				todo = append(todo, row)
			}
		}
		if round == 0 && len(todo) > MaxBulkRuns {
			return &apiError{status: http.StatusBadRequest, Code: CodeBulkTooLarge,
				Message: fmt.Sprintf("%d runs match; a bulk action takes at most %d: narrow the filter", len(todo), MaxBulkRuns)}
		}
		if len(todo) == 0 {
			return nil
		}
		// Oldest first, so that a stagger resumes in the order runs began.
		sort.Slice(todo, func(i, j int) bool { return todo[i].CreatedAt < todo[j].CreatedAt })
		if dryRun {
			for i := range todo {
				row := &todo[i]
				o := op(ctx, i, row, true)
				o.RunID, o.PlanID, o.Status, o.Substatus = row.RunID, row.PlanID, row.Status, row.Substatus
				if o.Outcome == OutcomeWould && row.InFlight > 0 {
					if snap, err := s.opts.Log.ProjectSnapshot(ctx, row.RunID); err == nil {
						o.InFlightStepIDs = snap.InFlight()
					}
				}
				res.Runs = append(res.Runs, o)
			}
			return nil
		}
		if round == bulkRounds || len(res.Runs)+len(todo) > MaxBulkRuns {
			for _, row := range todo {
				res.Runs = append(res.Runs, BulkRun{RunID: row.RunID, PlanID: row.PlanID, Status: row.Status, Substatus: row.Substatus, Outcome: OutcomeStartedDuring})
			}
			return nil
		}
		var out []BulkRun
		if act.many != nil {
			out = act.many(ctx, todo)
			for i := range todo {
				row := &todo[i]
				out[i].RunID, out[i].PlanID, out[i].Status, out[i].Substatus = row.RunID, row.PlanID, row.Status, row.Substatus
			}
		} else {
			out = s.eachRun(ctx, todo, placed, op)
		}
		placed += len(todo)
		for _, o := range out {
			done[o.RunID] = true
			res.Runs = append(res.Runs, o)
		}
	}
}

// eachRun acts on each run of todo with op, bulkWorkers at a time; placed
// is the place of todo's first run in the selection.
func (s *Server) eachRun(ctx context.Context, todo []runlist.Row, placed int, op func(context.Context, int, *runlist.Row, bool) BulkRun) []BulkRun {
	out := make([]BulkRun, len(todo))
	var wg sync.WaitGroup
	sem := make(chan struct{}, bulkWorkers)
	for i := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			row := &todo[i]
			o := op(ctx, placed+i, row, false)
			o.RunID, o.PlanID, o.Status, o.Substatus = row.RunID, row.PlanID, row.Status, row.Substatus
			out[i] = o
		}()
	}
	wg.Wait()
	return out
}
