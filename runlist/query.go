package runlist

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/conductor-sidecar/sidecar/statestore"
)

// Filter selects runs. Empty fields match any run.
type Filter struct {
	TenantID, ProjectID, EnvironmentID string
	PlanID, PlanVersion                string
	// Statuses matches a run in any of them; Substatus (DRAINING) one
	// with that substatus.
	Statuses  []string
	Substatus string
	// Selector is a label selector (ParseSelector); nil matches any run.
	Selector labels.Selector
	// UpdatedSince, when set, matches a run whose last event was
	// persisted at or after it (Row.UpdatedAt): every run an action of
	// that time or later touched.
	UpdatedSince time.Time
}

// Bounds of a label selector: an operator's selector names a few labels;
// these keep one request's parse and match cost small.
const (
	// MaxSelectorBytes bounds a selector's length.
	MaxSelectorBytes = 1024
	// MaxSelectorTerms bounds its terms (requirements, comma separated).
	MaxSelectorTerms = 20
)

// ParseSelector parses a label selector in Kubernetes' syntax
// ("team=data,tier!=gold", "tier in (gold,silver)", "!canary"), with
// Kubernetes' own parser (k8s.io/apimachinery), so that a selector means
// here what it means to kubectl. An error matches ErrSelectorInvalid.
func ParseSelector(s string) (labels.Selector, error) {
	if len(s) > MaxSelectorBytes {
		return nil, &Error{Code: CodeSelectorInvalid, Message: fmt.Sprintf("the selector is %d bytes; the limit is %d", len(s), MaxSelectorBytes)}
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, &Error{Code: CodeSelectorInvalid, Message: err.Error(), Err: err}
	}
	if reqs, _ := sel.Requirements(); len(reqs) > MaxSelectorTerms {
		return nil, &Error{Code: CodeSelectorInvalid, Message: fmt.Sprintf("the selector has %d terms; the limit is %d", len(reqs), MaxSelectorTerms)}
	}
	return sel, nil
}

// Match reports whether r passes every part of the filter.
func (f *Filter) Match(r *Row) bool {
	return f.matchFixed(r) && f.MatchStatus(r)
}

// MatchStatus reports whether r has one of the filter's statuses and its
// substatus, and was updated since UpdatedSince: the parts of a run that
// change.
func (f *Filter) MatchStatus(r *Row) bool {
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, r.Status) {
		return false
	}
	if !f.UpdatedSince.IsZero() {
		at, err := time.Parse(time.RFC3339Nano, r.UpdatedAt)
		if err != nil || at.Before(f.UpdatedSince) {
			return false
		}
	}
	return f.Substatus == "" || r.Substatus == f.Substatus
}

// matchFixed matches the parts of a run that never change: its scope,
// plan and labels.
func (f *Filter) matchFixed(r *Row) bool {
	switch {
	case f.TenantID != "" && r.TenantID != f.TenantID,
		f.ProjectID != "" && r.ProjectID != f.ProjectID,
		f.EnvironmentID != "" && r.EnvironmentID != f.EnvironmentID,
		f.PlanID != "" && r.PlanID != f.PlanID,
		f.PlanVersion != "" && r.PlanVersion != f.PlanVersion:
		return false
	}
	return f.Selector == nil || f.Selector.Matches(labels.Set(r.Labels))
}

// Page is one page of a listing.
type Page struct {
	Runs []Row `json:"runs"`
	// Continue, when set, asks for the next page.
	Continue string `json:"continue,omitempty"`
	// IndexedThrough is the log sequence the list includes: every event
	// persisted up to it is reflected in the rows.
	IndexedThrough uint64 `json:"indexedThrough"`
	// Revision is the list's revision at the time of the answer; Changes
	// after it are what a follower of the list needs next.
	Revision uint64 `json:"revision"`
}

// position is where a continue token resumes: after the run created at
// created with id runID, in the list's order (newest first, then runId).
type position struct {
	Created int64  `json:"c"`
	RunID   string `json:"r"`
}

func (p position) token() string {
	b, _ := json.Marshal(p)
	return base64.RawURLEncoding.EncodeToString(b)
}

// maxTokenBytes bounds a continue token: the longest token() makes (a
// runId of statestore.MaxIDBytes, each byte escaped by JSON) fits.
const maxTokenBytes = 4096

func parseToken(s string) (position, error) {
	var p position
	if len(s) > maxTokenBytes {
		return p, &Error{Code: CodeContinueInvalid, Message: fmt.Sprintf("a continue token is at most %d bytes: what the previous page returned, unchanged", maxTokenBytes)}
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &p)
	}
	if err == nil {
		err = statestore.CheckID(p.RunID, true)
	}
	if err != nil {
		return p, &Error{Code: CodeContinueInvalid, Message: "a continue token is what the previous page returned, unchanged"}
	}
	return p, nil
}

// before reports whether a comes before b in the list's order.
func before(a, b *entry) bool {
	if a.created != b.created {
		return a.created > b.created
	}
	return a.row.RunID < b.row.RunID
}

// List returns the runs that match f, newest first, at most limit (<= 0:
// all of them), from the position of cont (a Page's Continue; "" from the
// start). Runs created while a listing is paged through appear on no page
// if they sort before its position, and never twice. It reads memory:
// the open runs and the newest Options.MaxFinished finished ones; a page
// that goes past those reads the older finished runs from the bucket (a
// scan of the bucket), unless f selects open runs only or the replica
// knows that no finished row is beyond its window (window). It also reads
// Options.Plans for a plan version it has not read yet.
func (l *List) List(f Filter, limit int, cont string) (*Page, error) {
	var from *entry
	if cont != "" {
		p, err := parseToken(cont)
		if err != nil {
			return nil, err
		}
		from = &entry{created: p.Created, row: Row{RunID: p.RunID}}
	}
	mr := l.mirror
	mr.mu.Lock() // sorting may write
	if !mr.synced {
		mr.mu.Unlock()
		return nil, ErrSyncing
	}
	if mr.stale {
		mr.sorted = mr.sorted[:0]
		for _, e := range mr.st.rows {
			mr.sorted = append(mr.sorted, e)
		}
		sort.Slice(mr.sorted, func(i, j int) bool { return before(mr.sorted[i], mr.sorted[j]) })
		mr.stale = false
	}
	page := &Page{Runs: []Row{}, IndexedThrough: mr.st.cursor, Revision: mr.st.rev}
	i := 0
	if from != nil {
		i = sort.Search(len(mr.sorted), func(k int) bool { return before(from, mr.sorted[k]) })
	}
	bound, letGoN := mr.st.bound, mr.st.letGoN
	if mr.st.noneBeyond() {
		bound = nil // nothing beyond it: memory holds every row
	}
	var last *entry // the last run on the page
	full := false
	for ; i < len(mr.sorted); i++ {
		e := mr.sorted[i]
		if bound != nil && !before(e, bound) {
			break // the rest is merged with the bucket's rows
		}
		if !f.Match(&e.row) {
			continue
		}
		if limit > 0 && len(page.Runs) == limit {
			full = true
			break
		}
		page.Runs = append(page.Runs, e.row)
		last = e
	}
	// Beyond the bound: the open runs there, from memory, and the
	// finished ones, from the bucket.
	var beyond []entry
	if !full && bound != nil {
		for ; i < len(mr.sorted); i++ {
			if e := mr.sorted[i]; f.Match(&e.row) {
				beyond = append(beyond, *e)
			}
		}
	}
	mr.mu.Unlock()
	if !full && bound != nil && !f.openOnly() {
		want := 0
		if limit > 0 {
			// One more than the page needs (to tell whether a next page
			// is), and as many again as memory has beyond the bound (a
			// run in both counts once).
			want = limit - len(page.Runs) + 1 + len(beyond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), scanTimeout)
		stored, anyBeyond, err := l.scanFinished(ctx, f, bound, from, want)
		cancel()
		if err != nil {
			return nil, err
		}
		if !anyBeyond {
			mr.mu.Lock()
			mr.st.noneFound(bound, letGoN)
			mr.mu.Unlock()
		}
		beyond = mergeBeyond(beyond, stored)
	}
	for k := range beyond {
		e := &beyond[k]
		if limit > 0 && len(page.Runs) == limit {
			full = true
			break
		}
		page.Runs = append(page.Runs, e.row)
		last = e
	}
	if full {
		page.Continue = position{Created: last.created, RunID: last.row.RunID}.token()
	}
	l.addETAs(page.Runs)
	l.plans.fill(context.Background(), page.Runs)
	return page, nil
}

// scanTimeout bounds a scan of the bucket for the finished runs beyond
// the memory's bound.
const scanTimeout = 2 * time.Minute

// openOnly reports whether f selects open runs only (every one of its
// statuses is not terminal, or it asks for DRAINING): those are all in
// memory.
func (f *Filter) openOnly() bool {
	if f.Substatus != "" {
		return true
	}
	if len(f.Statuses) == 0 {
		return false
	}
	for _, s := range f.Statuses {
		if statestore.IsTerminalRunStatus(s) {
			return false
		}
	}
	return true
}

// scanFinished reads the bucket's finished rows that match f, sort at or
// after bound and after from (nil: the start), and returns the first want
// of them in the list's order (want <= 0: all); anyBeyond tells whether
// the bucket holds any finished row at or after bound, matching or not.
func (l *List) scanFinished(ctx context.Context, f Filter, bound, from *entry, want int) (_ []entry, anyBeyond bool, _ error) {
	w, err := l.kv.Watch(ctx, keyRun+">", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, false, fmt.Errorf("%w: read the run list: %w", ErrUnavailable, err)
	}
	defer func() { _ = w.Stop() }()
	var out []entry
	trim := func() {
		sort.Slice(out, func(i, j int) bool { return before(&out[i], &out[j]) })
		if want > 0 && len(out) > want {
			out = out[:want]
		}
	}
	for {
		var kve jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return nil, false, fmt.Errorf("%w: read the run list: %w", ErrUnavailable, ctx.Err())
		case kve, ok = <-w.Updates():
		}
		if !ok {
			return nil, false, fmt.Errorf("%w: read the run list: the watch ended", ErrUnavailable)
		}
		if kve == nil {
			break // every row is in
		}
		var r Row
		if json.Unmarshal(kve.Value(), &r) != nil || !statestore.IsTerminalRunStatus(r.Status) {
			continue
		}
		e := entry{row: r, rev: kve.Revision(), created: r.created().UnixNano(), finIndex: -1}
		if before(&e, bound) {
			continue
		}
		anyBeyond = true
		if (from != nil && !before(from, &e)) || !f.Match(&e.row) {
			continue
		}
		out = append(out, e)
		if want > 0 && len(out) >= 2*want+64 {
			trim()
		}
	}
	trim()
	return out, anyBeyond, nil
}

// mergeBeyond merges the rows beyond the bound from memory (open runs)
// and from the bucket (finished ones), both in the list's order, keeping
// memory's row of a run that is in both.
func mergeBeyond(mem, stored []entry) []entry {
	in := make(map[string]bool, len(mem))
	for i := range mem {
		in[mem[i].row.RunID] = true
	}
	out := make([]entry, 0, len(mem)+len(stored))
	i, j := 0, 0
	for i < len(mem) || j < len(stored) {
		switch {
		case j < len(stored) && in[stored[j].row.RunID]:
			j++
		case j == len(stored) || (i < len(mem) && before(&mem[i], &stored[j])):
			out = append(out, mem[i])
			i++
		default:
			out = append(out, stored[j])
			j++
		}
	}
	return out
}

// Changes returns the rows changed after revision after whose fixed
// parts (scope, plan, labels) match f, waiting up to wait for one when
// there are none yet; the status parts are not applied, so that a
// follower sees a run leave its selection too (Filter.MatchStatus tells).
// The Page's Revision is what to pass next time.
func (l *List) Changes(ctx context.Context, f Filter, after uint64, wait time.Duration) (*Page, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	mr := l.mirror
	for {
		mr.mu.RLock()
		if !mr.synced {
			mr.mu.RUnlock()
			return nil, ErrSyncing
		}
		page := &Page{Runs: []Row{}, IndexedThrough: mr.st.cursor, Revision: mr.st.rev}
		for _, e := range mr.st.rows {
			if e.rev > after && f.matchFixed(&e.row) {
				page.Runs = append(page.Runs, e.row)
			}
		}
		ch := mr.changed
		mr.mu.RUnlock()
		if len(page.Runs) > 0 || wait <= 0 {
			sort.Slice(page.Runs, func(i, j int) bool { return page.Runs[i].LastEventSeq < page.Runs[j].LastEventSeq })
			l.addETAs(page.Runs)
			l.plans.fill(ctx, page.Runs)
			return page, nil
		}
		select {
		case <-ctx.Done():
			return page, nil
		case <-deadline.C:
			return page, nil
		case <-ch:
		}
	}
}

// addETAs estimates the drain end of the DRAINING runs among rows.
func (l *List) addETAs(rows []Row) {
	now := time.Now()
	for i := range rows {
		if r := &rows[i]; r.Substatus == statestore.SubstatusDraining {
			r.DrainETA = l.mirror.eta(r.TenantID, r.PlanID, r.PlanVersion, r.InFlightSteps, now)
		}
	}
}

// pausedByReason counts the PAUSED runs by where their pause came from
// (Row.PauseOrigin; a row written before it existed counts as operator).
func (l *List) pausedByReason() map[string]int {
	counts := map[string]int{}
	for _, o := range pauseOrigins {
		counts[o] = 0
	}
	l.mirror.mu.RLock()
	for _, e := range l.mirror.st.paused {
		o := e.row.PauseOrigin
		if _, known := counts[o]; !known {
			o = PauseOriginOperator
		}
		counts[o]++
	}
	l.mirror.mu.RUnlock()
	return counts
}

// ActiveCounts counts the RUNNING and PAUSED runs of the list, in all, by
// tenant and by plan of a tenant ({tenantId, planId}: plan ids are one
// namespace every tenant names) (admission control's load); ok is false
// until the replica has read the list. It scans every row.
func (l *List) ActiveCounts() (total int, byTenant map[string]int, byPlan map[[2]string]int, ok bool) {
	byTenant, byPlan = map[string]int{}, map[[2]string]int{}
	l.mirror.mu.RLock()
	defer l.mirror.mu.RUnlock()
	if !l.mirror.synced {
		return 0, byTenant, byPlan, false
	}
	for _, e := range l.mirror.st.rows {
		if s := e.row.Status; s == statestore.RunStatusRunning || s == statestore.RunStatusPaused {
			total++
			byTenant[e.row.TenantID]++
			byPlan[[2]string{e.row.TenantID, e.row.PlanID}]++
		}
	}
	return total, byTenant, byPlan, true
}

// ShowsStarted tells whether the list shows runID started: its row is
// RUNNING, PAUSED or terminal (not absent, QUEUED or PENDING).
func (l *List) ShowsStarted(runID string) bool {
	l.mirror.mu.RLock()
	defer l.mirror.mu.RUnlock()
	e, ok := l.mirror.st.rows[runID]
	if !ok {
		return false
	}
	s := e.row.Status
	return s == statestore.RunStatusRunning || s == statestore.RunStatusPaused || statestore.IsTerminalRunStatus(s)
}
