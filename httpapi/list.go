package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/runlist"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// RunLister lists runs; *runlist.List satisfies it.
type RunLister interface {
	List(f runlist.Filter, limit int, cont string) (*runlist.Page, error)
	// HasRow reports whether the list holds a row of runID (a run in
	// hot state is listed from there, not from the archive).
	HasRow(ctx context.Context, runID string) (bool, error)
	// WaitIndexed waits until the list includes every event persisted
	// before the call (a bulk action's selection).
	WaitIndexed(ctx context.Context) (uint64, error)
	// DrainETA estimates the end of the drain of snap's run.
	DrainETA(snap *statestore.RunSnapshot, now time.Time) *runlist.ETA
	Changes(ctx context.Context, f runlist.Filter, after uint64, wait time.Duration) (*runlist.Page, error)
}

// Limits of GET /v1/runs.
const (
	DefaultListLimit = 500
	MaxListLimit     = 5000
	// MaxWatchWait bounds a watch's timeoutSeconds.
	MaxWatchWait = 60 * time.Second
)

// runStatuses are the statuses a status filter may name.
var runStatuses = []string{
	statestore.RunStatusPending, statestore.RunStatusQueued, statestore.RunStatusApproved, statestore.RunStatusRunning,
	statestore.RunStatusPaused, statestore.RunStatusCompleted, statestore.RunStatusFailed, statestore.RunStatusCancelled,
}

// ListedRun is a run in a listing. In a watch, Matches says whether the
// run still passes the status filter (a run that left it is reported once
// more, with false).
type ListedRun struct {
	runlist.Row
	// QueuePosition is a QUEUED run's place among the runs waiting for
	// admission (1: next), as GET /v1/runs/{runId} gives it.
	QueuePosition int `json:"queuePosition,omitempty"`
	// DrainDeadline is when a DRAINING run's drain times out (its
	// pause's timeout, or the sidecar's default, after PausedAt).
	DrainDeadline string `json:"drainDeadline,omitempty"`
	Matches       *bool  `json:"matches,omitempty"`
	// Archived is set on a run that left hot state, listed from the
	// archive (include=archived).
	Archived bool `json:"archived,omitempty"`
}

// RunList is the answer of GET /v1/runs.
type RunList struct {
	Runs           []ListedRun `json:"runs"`
	Continue       string      `json:"continue,omitempty"`
	IndexedThrough uint64      `json:"indexedThrough"`
	Revision       uint64      `json:"revision"`
	// Unreadable are the archive's manifests this page passed over because
	// they could not be read (damaged, or missing from the sequence): the
	// archived runs they list are not in the listing.
	Unreadable []UnreadableManifest `json:"unreadableManifests,omitempty"`
}

// UnreadableManifest is a manifest (or a run of missing ones, From to
// Through) a listing of archived runs passed over, and why: the code of
// the error (ARCHIVE_CORRUPT, ARCHIVE_MANIFEST_MISSING, ...). What the
// damage is, `sidecar archive verify` says.
type UnreadableManifest struct {
	From    uint64 `json:"from"`
	Through uint64 `json:"through"`
	Code    string `json:"code"`
}

// listFilter reads a listing's filter from q: tenantId, projectId,
// environmentId, planId, planVersion, status (comma separated, or
// repeated), substatus, labelSelector and updatedSince. A scoped caller's scope is
// added to it; a filter outside the scope matches nothing (ok false).
func listFilter(r *http.Request, q url.Values) (f runlist.Filter, ok bool, err error) {
	f = runlist.Filter{
		TenantID: q.Get("tenantId"), ProjectID: q.Get("projectId"), EnvironmentID: q.Get("environmentId"),
		PlanID: q.Get("planId"), PlanVersion: q.Get("planVersion"), Substatus: q.Get("substatus"),
	}
	if err := checkOptionalIDs(true, [2]string{"tenantId", f.TenantID}, [2]string{"projectId", f.ProjectID},
		[2]string{"environmentId", f.EnvironmentID}, [2]string{"planId", f.PlanID}, [2]string{"planVersion", f.PlanVersion}); err != nil {
		return f, false, err
	}
	for _, v := range q["status"] {
		for _, st := range strings.Split(v, ",") {
			st = strings.ToUpper(strings.TrimSpace(st))
			if !slices.Contains(runStatuses, st) {
				return f, false, badRequest("status", fmt.Sprintf("status %q: one of %s", st, strings.Join(runStatuses, ", ")))
			}
			f.Statuses = append(f.Statuses, st)
		}
	}
	if f.Substatus != "" && f.Substatus != statestore.SubstatusDraining {
		return f, false, badRequest("substatus", "substatus: "+statestore.SubstatusDraining+" is the only one")
	}
	if f.Selector, err = runlist.ParseSelector(q.Get("labelSelector")); err != nil {
		return f, false, err
	}
	if v := q.Get("updatedSince"); v != "" {
		if f.UpdatedSince, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return f, false, badRequest("updatedSince", fmt.Sprintf("updatedSince %q: want an RFC 3339 time (2026-11-23T06:00:00Z)", v))
		}
	}
	if p := PrincipalFrom(r.Context()); p != nil {
		for _, c := range []struct{ scope, filter *string }{
			{&p.Scope.TenantID, &f.TenantID}, {&p.Scope.ProjectID, &f.ProjectID}, {&p.Scope.EnvironmentID, &f.EnvironmentID},
		} {
			if *c.scope == "" {
				continue
			}
			if *c.filter != "" && *c.filter != *c.scope {
				return f, false, nil
			}
			*c.filter = *c.scope
		}
	}
	return f, true, nil
}

// list serves GET /v1/runs: the runs that match the filter, newest first,
// limit at a time (continue: the previous page's token), and with
// include=archived the archived runs after them; with watch=true,
// the runs changed after revision, waiting up to timeoutSeconds for one.
func (s *Server) list(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f, ok, err := listFilter(r, q)
	if err != nil {
		return err
	}
	switch watch, given := q["watch"]; {
	case !given, watch[0] == "false":
	case watch[0] == "true":
		return s.watchList(w, r, q, f, ok)
	default:
		return badRequest("watch", fmt.Sprintf("watch must be true or false, not %q", watch[0]))
	}
	limit, err := intParam(q.Get("limit"), DefaultListLimit, "limit")
	if err != nil {
		return err
	}
	if limit < 1 || limit > MaxListLimit {
		return badRequest("limit", fmt.Sprintf("limit must be 1..%d", MaxListLimit))
	}
	archived := false
	switch inc := q.Get("include"); {
	case inc == IncludeArchived && s.opts.Archive != nil:
		archived = true
	case inc == IncludeArchived, inc == "":
		// No archive: every run is in hot state.
	default:
		return badRequest("include", fmt.Sprintf("include %q: %s is the only value", inc, IncludeArchived))
	}
	if !ok {
		// Outside the caller's scope: nothing (no archived run either),
		// with the list's revision as on any other page.
		f, archived = runlist.Filter{TenantID: "\x00"}, false
	}
	cont := q.Get("continue")
	if archived {
		if pos, isArchive := parseArchivePos(cont); isArchive {
			out := RunList{Runs: []ListedRun{}}
			if err := s.listArchived(r.Context(), f, int(limit), pos, &out); err != nil {
				return err
			}
			return writeJSON(w, http.StatusOK, out)
		}
	}
	page, err := s.opts.List.List(f, int(limit), cont)
	if err != nil {
		return err
	}
	out := RunList{Runs: make([]ListedRun, len(page.Runs)), Continue: page.Continue, IndexedThrough: page.IndexedThrough, Revision: page.Revision}
	for i, row := range page.Runs {
		out.Runs[i] = s.listed(row)
	}
	if archived && out.Continue == "" {
		// Hot state is listed to its end: the archived runs follow. An
		// archive that cannot be read leaves the page to the hot runs, with
		// a continue token at the archive's start: that page answers the
		// archive's error until it can be read.
		hot := len(out.Runs)
		if err := s.listArchived(r.Context(), f, int(limit), archivePos{i: -1}, &out); err != nil {
			if !errors.Is(err, archive.ErrUnavailable) || hot == 0 {
				return err
			}
			out.Runs, out.Continue = out.Runs[:hot], archivePos{i: -1}.token()
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) watchList(w http.ResponseWriter, r *http.Request, q url.Values, f runlist.Filter, ok bool) error {
	after, err := intParam(q.Get("revision"), 0, "revision")
	if err != nil {
		return err
	}
	if after < 0 {
		return badRequest("revision", "revision must be >= 0")
	}
	wait, err := intParam(q.Get("timeoutSeconds"), 30, "timeoutSeconds")
	if err != nil {
		return err
	}
	if wait < 0 || time.Duration(wait)*time.Second > MaxWatchWait {
		return badRequest("timeoutSeconds", fmt.Sprintf("timeoutSeconds must be 0..%d", int(MaxWatchWait/time.Second)))
	}
	if !ok {
		f = runlist.Filter{TenantID: "\x00"} // outside the caller's scope: nothing, after the wait
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.closing, cancel)()
	page, err := s.opts.List.Changes(ctx, f, uint64(after), time.Duration(wait)*time.Second)
	if err != nil {
		return err
	}
	if err := s.stillCaller(w, r); err != nil {
		return err
	}
	out := RunList{Runs: make([]ListedRun, len(page.Runs)), IndexedThrough: page.IndexedThrough, Revision: page.Revision}
	for i, row := range page.Runs {
		m := f.MatchStatus(&row)
		out.Runs[i] = s.listed(row)
		out.Runs[i].Matches = &m
	}
	return writeJSON(w, http.StatusOK, out)
}

// stillCaller checks, after a watch's wait, that r's credentials still
// name the principal r was authorized as (same name, roles and scope): a
// tokens file reloaded meanwhile may have removed it or changed its scope,
// and the change the watch woke for is not answered to what it no longer
// is (401: the caller asks again with what it holds now).
func (s *Server) stillCaller(w http.ResponseWriter, r *http.Request) error {
	was := PrincipalFrom(r.Context())
	if was == nil || s.opts.Auth == nil {
		return nil
	}
	now, err := s.opts.Auth.Authenticate(r)
	if err != nil {
		now, err = s.cookiePrincipal(r)
	}
	if err != nil || now.Name != was.Name || now.Scope != was.Scope || !slices.Equal(now.Roles, was.Roles) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sidecar"`)
		return &apiError{status: http.StatusUnauthorized, Code: CodeUnauthenticated,
			Message: "the credentials no longer name the principal this watch began as (the tokens file changed while it waited): ask again"}
	}
	return nil
}

// listed is row as a listing shows it.
func (s *Server) listed(row runlist.Row) ListedRun {
	lr := ListedRun{Row: row, QueuePosition: s.queuePosition(&row)}
	if at, err := time.Parse(time.RFC3339Nano, row.PausedAt); err == nil && row.Substatus == statestore.SubstatusDraining {
		timeout := time.Duration(row.DrainTimeoutSeconds) * time.Second
		if timeout <= 0 {
			timeout = s.opts.DrainTimeout
		}
		lr.DrainDeadline = at.Add(timeout).UTC().Format(time.RFC3339Nano)
	}
	return lr
}

// queuePosition is a QUEUED row's place in the admission queue (0 for
// any other row, or without admission control).
func (s *Server) queuePosition(row *runlist.Row) int {
	if row.Status != statestore.RunStatusQueued || s.opts.Queue == nil {
		return 0
	}
	return s.opts.Queue.Position(row.RunID)
}
