package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// ArchiveReader reads the runs that left hot state (an *archive.Archive).
type ArchiveReader interface {
	// Lookup returns the archive's entry of runID, or an error matching
	// archive.ErrRunNotFound.
	Lookup(ctx context.Context, runID string) (*archive.RunEntry, error)
	// Records returns the archived records of runID, checked against the
	// archive's manifest, or an error matching archive.ErrRunNotFound.
	Records(ctx context.Context, runID string) ([]statestore.RunEventRecord, error)
	// ManifestSeqs lists the archive's manifests, oldest first, reading
	// none of them.
	ManifestSeqs(ctx context.Context) ([]uint64, error)
	// Manifest reads and checks one manifest.
	Manifest(ctx context.Context, seq uint64) (*archive.Manifest, error)
	// NewestSeq returns the manifest of runID's newest copy, knowing the
	// archive has manifests through through.
	NewestSeq(ctx context.Context, runID string, through uint64) (uint64, error)
}

// DefaultArchiveReadTimeout bounds each read of the archive a request
// makes (Options.ArchiveReadTimeout): a destination that accepts requests
// and answers none (a hung S3 server) answers 503 ARCHIVE_UNAVAILABLE
// then, rather than holding the request and its connection for as long as
// it stays silent. A segment of 200 runs reads in well under a second
// from a destination that answers.
const DefaultArchiveReadTimeout = 15 * time.Second

// boundedArchive is an ArchiveReader whose every call is bounded by
// timeout (an earlier deadline of the caller's stays).
type boundedArchive struct {
	ArchiveReader
	timeout time.Duration
}

// bounded runs call under the bound; a call that ran out of it without an
// archive error of its own (a destination that ignores its context) is
// ARCHIVE_UNAVAILABLE.
func bounded[T any](ctx context.Context, timeout time.Duration, call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, err := call(ctx)
	var ae *archive.Error
	if err != nil && !errors.As(err, &ae) && errors.Is(err, context.DeadlineExceeded) {
		err = &archive.Error{Code: archive.CodeUnavailable, Message: fmt.Sprintf("the archive did not answer within %s", timeout), Err: err}
	}
	return v, err
}

func (b boundedArchive) Lookup(ctx context.Context, runID string) (*archive.RunEntry, error) {
	return bounded(ctx, b.timeout, func(ctx context.Context) (*archive.RunEntry, error) { return b.ArchiveReader.Lookup(ctx, runID) })
}

func (b boundedArchive) Records(ctx context.Context, runID string) ([]statestore.RunEventRecord, error) {
	return bounded(ctx, b.timeout, func(ctx context.Context) ([]statestore.RunEventRecord, error) {
		return b.ArchiveReader.Records(ctx, runID)
	})
}

func (b boundedArchive) ManifestSeqs(ctx context.Context) ([]uint64, error) {
	return bounded(ctx, b.timeout, b.ArchiveReader.ManifestSeqs)
}

func (b boundedArchive) Manifest(ctx context.Context, seq uint64) (*archive.Manifest, error) {
	return bounded(ctx, b.timeout, func(ctx context.Context) (*archive.Manifest, error) { return b.ArchiveReader.Manifest(ctx, seq) })
}

func (b boundedArchive) NewestSeq(ctx context.Context, runID string, through uint64) (uint64, error) {
	return bounded(ctx, b.timeout, func(ctx context.Context) (uint64, error) { return b.ArchiveReader.NewestSeq(ctx, runID, through) })
}

// runSnapshot returns runID's snapshot from hot state or, when the run
// left it, projected from its archived records (archived true). A
// finished run's snapshot may still be cached in memory after its records
// left: it is answered from the archive then, as every replica would.
func (s *Server) runSnapshot(ctx context.Context, runID string) (snap *statestore.RunSnapshot, archived bool, err error) {
	snap, err = s.opts.Log.ProjectSnapshot(ctx, runID)
	switch {
	case s.opts.Archive == nil:
		return snap, false, err
	case errors.Is(err, statestore.ErrNotFound):
	case err != nil:
		return nil, false, err
	case !statestore.IsTerminalRunStatus(snap.Status):
		return snap, false, nil
	default:
		hot, err := s.inHotState(ctx, runID)
		if err != nil || hot {
			return snap, false, err
		}
	}
	recs, err := s.archivedRecords(ctx, runID)
	if err != nil {
		return nil, false, err
	}
	snap, _ = statestore.Reduce(nil, recs)
	return snap, true, nil
}

// archivedOutside reports whether an archived run whose records could not
// be read (err, the archive's) is outside scope, or cannot be shown to be
// inside it: its manifest entry names its tenant, project and environment,
// and an entry that cannot be read either proves nothing. Such a run is
// answered as one that does not exist, as a run of another tenant is, so
// that a scoped principal learns neither its existence nor the archive's
// objects from the error.
func (s *Server) archivedOutside(ctx context.Context, scope Scope, runID string, err error) bool {
	var ae *archive.Error
	if s.opts.Archive == nil || !errors.As(err, &ae) {
		return false
	}
	e, lerr := s.opts.Archive.Lookup(ctx, runID)
	return lerr != nil || !scope.Allows(e.TenantID, e.ProjectID, e.EnvironmentID)
}

// inHotState reports whether the log still holds a record of runID.
func (s *Server) inHotState(ctx context.Context, runID string) (bool, error) {
	recs, err := s.opts.Log.Fetch(ctx, runID, 0, 1)
	return len(recs) > 0, err
}

// archivedRecords returns runID's records from the archive; a run the
// archive does not hold is statestore.ErrNotFound (no such run).
func (s *Server) archivedRecords(ctx context.Context, runID string) ([]statestore.RunEventRecord, error) {
	recs, err := s.opts.Archive.Records(ctx, runID)
	switch {
	case errors.Is(err, archive.ErrRunNotFound):
		return nil, statestore.ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("read run %q from the archive: %w", runID, err)
	case len(recs) == 0:
		return nil, statestore.ErrNotFound
	}
	return recs, nil
}

// archivedEvents answers GET /v1/runs/{runId}/events for a run that is
// not in hot state: a page of its archived records after afterSeq.
func (s *Server) archivedEvents(w http.ResponseWriter, r *http.Request, runID string, after int64, limit int) error {
	recs, err := s.archivedRecords(r.Context(), runID)
	if errors.Is(err, statestore.ErrNotFound) {
		return &apiError{status: http.StatusNotFound, Code: CodeRunNotFound, Message: "no such run"}
	}
	if err != nil {
		return err
	}
	page := EventsPage{Events: []statestore.RunEventRecord{}, NextAfterSeq: after, Archived: true}
	for _, rec := range recs {
		if rec.RunSeq <= after {
			continue
		}
		if len(page.Events) == limit {
			break
		}
		page.Events = append(page.Events, rec)
		page.NextAfterSeq = rec.RunSeq
	}
	return writeJSON(w, http.StatusOK, page)
}

// archivedConflict turns a control action's refusal (no such run, or a
// transition a finished run cannot make) into RUN_ARCHIVED when the run
// left hot state for the archive; any other error is returned as it is.
func (s *Server) archivedConflict(ctx context.Context, runID string, err error) error {
	if s.opts.Archive == nil || runID == "" {
		return err
	}
	var ae *apiError
	refused := errors.Is(err, errcode.NotFound) || errors.Is(err, errcode.Conflict) ||
		errors.As(err, &ae) && (ae.status == http.StatusNotFound || ae.status == http.StatusConflict)
	if !refused {
		return err
	}
	if hot, herr := s.inHotState(ctx, runID); herr != nil || hot {
		return err
	}
	if _, lerr := s.opts.Archive.Lookup(ctx, runID); lerr != nil {
		return err
	}
	return &apiError{status: http.StatusConflict, Code: CodeRunArchived,
		Message: fmt.Sprintf("run %s left hot state and is archived: it can be read, not steered", runID)}
}
