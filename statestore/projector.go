package statestore

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// AlertSink receives invalid-transition alerts. The Projector calls Alert at
// most once per (runId, eventId) over its lifetime.
type AlertSink interface {
	InvalidTransition(ctx context.Context, a InvalidTransitionAlert)
}

// AlertGate makes invalid-transition alerts idempotent beyond one process:
// First reports whether this call is the first, across every process that
// shares the gate, to claim the alert for (runID, eventID). Implementations
// must be atomic (e.g. a create-if-absent in a shared KV store).
type AlertGate interface {
	First(ctx context.Context, runID, eventID string) (bool, error)
}

// ProjectorOptions configures a Projector. The zero value works: no logger,
// no metrics, no alert sink beyond the log.
type ProjectorOptions struct {
	Logger  *zap.Logger
	Metrics *Metrics
	Alerts  AlertSink
	// Gate, when set, makes alerts idempotent across restarts and replicas;
	// without it they are idempotent within this Projector. If the gate
	// fails, the alert is raised (a duplicate is better than a lost alert).
	Gate AlertGate
	// Contiguous tells the projector that the source assigns runSeq without
	// gaps (1, 2, 3, ... per run), so a gap is a visibility gap. A source
	// whose sequences are gappy by design (JetStream: stream sequences) sets
	// false and never triggers a resync in steady state.
	Contiguous bool
	// GapGrace is how long the projector holds back the records after an
	// open visibility gap before it applies them anyway, the run staying
	// Stale until the gap fills (default 30s).
	GapGrace time.Duration
	// PageSize is the Fetch limit per call (default 1000).
	PageSize int
	// Now is the clock for lag measurement (default time.Now).
	Now func() time.Time
	// Durable, when set, keeps snapshots across restarts (Execution Semantics
	// Contract v1.1 §1): a run not in memory is projected from its persisted
	// snapshot and the records after its watermark, once the log is seen to
	// still hold the record the snapshot was taken at; otherwise (the log was
	// restored from an older backup, a record was deleted) the snapshot is
	// discarded, the run rebuilt from the log and marked Stale.
	Durable SnapshotStore
	// SaveEvery is how many records a run's snapshot may be ahead of its
	// persisted one before it is saved again (default 32); a terminal
	// snapshot is saved at once. A restart replays at most that many
	// records per run.
	SaveEvery int64
	// MaxRuns bounds the runs whose snapshots are kept (default
	// DefaultMaxRuns). Past it the least recently used run that no
	// projection holds is dropped; its next projection rebuilds it from
	// the log (or its persisted snapshot), which gives the same snapshot
	// (Reduce is pure).
	MaxRuns int
}

// DefaultMaxRuns is how many runs' snapshots a Projector keeps without
// ProjectorOptions.MaxRuns: the runs read lately (steps in flight, a bulk
// action's batch of 1,000), not every active run. Runs paused and left
// alone are dropped and rebuilt when next read, which costs one read of
// the run's records instead of one after its watermark.
const DefaultMaxRuns = 2000

// Projector keeps an up-to-date snapshot per run by reducing the records
// that a Fetcher returns after the snapshot's watermark. It is safe for
// concurrent use; projections of one run are serialized, and concurrent
// ones share a fetch (Project).
type Projector struct {
	src  Fetcher
	opts ProjectorOptions
	log  *zap.Logger

	mu      sync.Mutex
	runs    map[string]*list.Element // of *runProjection, most recent first
	lru     list.List
	alerted map[alertKey]struct{}
}

type alertKey struct{ runID, eventID string }

type runProjection struct {
	runID string
	mu    sync.Mutex
	// roundMu guards next, the fetch that calls arriving now wait for
	// (nil: none waits; the next call starts one).
	roundMu sync.Mutex
	next    *projectRound
	snap    *RunSnapshot
	// gapSince is when the open visibility gap was first seen (zero: none);
	// gapAt is the runSeq observed right after the hole.
	gapSince time.Time
	gapAt    int64
	// accepted is set once the open gap outlived GapGrace.
	accepted bool
	// lastEventID is the eventId of the record at snap's watermark; saved
	// the EventCount of the persisted snapshot; lost the watermark of a
	// persisted snapshot whose record the log no longer holds (the run
	// stays Stale).
	lastEventID string
	saved       int64
	lost        int64
}

// SnapshotStore keeps snapshots across restarts (natsstore: the KV bucket
// SIDECAR_SNAPSHOTS). LoadSnapshot returns ErrNotFound when it has none.
type SnapshotStore interface {
	LoadSnapshot(ctx context.Context, runID string) (*DurableSnapshot, error)
	SaveSnapshot(ctx context.Context, d *DurableSnapshot) error
	DeleteSnapshot(ctx context.Context, runID string) error
}

// SnapshotChecker is a SnapshotStore that can tell whether the log still
// holds the very records a snapshot was projected from (pgstore: the hash
// chain up to its watermark). The projector calls CheckSnapshot on each
// snapshot it loads, once the record at the watermark is found; an error
// that is not ErrUnavailable discards the snapshot as a missing record
// does (STALE, PROJECTOR_SNAPSHOT_MISMATCH, the error logged).
type SnapshotChecker interface {
	CheckSnapshot(ctx context.Context, d *DurableSnapshot) error
}

// DurableSnapshot is a persisted snapshot: the snapshot with the eventId
// of the record at its watermark (LastEventSeq), which a load checks the
// log still holds.
type DurableSnapshot struct {
	Version     int          `json:"v"`
	Snapshot    *RunSnapshot `json:"snapshot"`
	LastEventID string       `json:"lastEventId"`
}

// DurableSnapshotVersion is the version of DurableSnapshot written; any
// other is ignored (rebuilt from the log).
const DurableSnapshotVersion = 1

// NewProjector returns a Projector reading from src.
func NewProjector(src Fetcher, opts ProjectorOptions) *Projector {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.GapGrace <= 0 {
		opts.GapGrace = 30 * time.Second
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 1000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxRuns <= 0 {
		opts.MaxRuns = DefaultMaxRuns
	}
	if opts.SaveEvery <= 0 {
		opts.SaveEvery = 32
	}
	return &Projector{src: src, opts: opts, log: opts.Logger.Named("projector"),
		runs: make(map[string]*list.Element), alerted: make(map[alertKey]struct{})}
}

// Snapshot returns the cached snapshot of runID, projecting it first if
// there is none. It returns ErrNotFound for a run without events.
func (p *Projector) Snapshot(ctx context.Context, runID string) (*RunSnapshot, error) {
	if CheckID(runID, false) != nil {
		return nil, ErrNotFound // no write could have used it: nothing to read, no key or subject to build
	}
	rp := p.run(runID)
	rp.mu.Lock()
	snap := rp.snap
	rp.mu.Unlock()
	if snap != nil {
		return snap, nil
	}
	return p.Project(ctx, runID)
}

// Project fetches the records after the run's watermark, reduces them and
// returns the new snapshot. It returns ErrNotFound for a run without events.
//
// With a contiguous source, a hole in runSeq is a visibility gap (Execution
// Semantics Contract v1.1 §1.1, §1.5): the run is marked Stale and, while the
// hole is open, every projection is a resync that rebuilds the snapshot from
// scratch. Records after the hole are held back for GapGrace; after that they
// are applied so the run's projection is not frozen, but the run stays Stale.
// Stale clears once a resync sees the hole filled and the watermark past it.
// Because each resync starts from scratch, a record that becomes visible late
// is never skipped.
//
// Concurrent projections of one run share a fetch: a call that arrives
// while a fetch of the run is in flight waits for the next fetch, which
// starts after it arrived, and every call that arrived meanwhile takes
// that fetch's result. A call never takes the result of a fetch that
// started before it, so it sees every record appended before it was made.
func (p *Projector) Project(ctx context.Context, runID string) (*RunSnapshot, error) {
	if CheckID(runID, false) != nil {
		return nil, ErrNotFound
	}
	rp := p.run(runID)
	for {
		rp.roundMu.Lock()
		r := rp.next
		lead := r == nil
		if lead {
			r = &projectRound{done: make(chan struct{})}
			rp.next = r
		}
		rp.roundMu.Unlock()
		if lead {
			p.lead(ctx, rp, runID, r)
			if errors.Is(r.err, ErrNotFound) {
				p.forgetEmpty(rp)
			}
			return r.snap, r.err
		}
		select {
		case <-r.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if r.err != nil && r.leaderEnded && ctx.Err() == nil {
			continue // the leader's call ended, not this one's: fetch again
		}
		return r.snap, r.err
	}
}

// lead makes round r's fetch once the fetch in flight ended, and hands
// its result to the calls waiting for r.
func (p *Projector) lead(ctx context.Context, rp *runProjection, runID string, r *projectRound) {
	defer close(r.done)
	rp.mu.Lock() // the fetch in flight ends
	defer rp.mu.Unlock()
	rp.roundMu.Lock()
	rp.next = nil // a later call waits for a fetch that starts after it
	rp.roundMu.Unlock()
	// What the waiting calls get if project panics: they must not wait
	// for good.
	r.err = &Error{Code: CodeStoreUnavailable, Message: "the projection of run " + runID + " failed; read it again"}
	r.snap, r.err = p.project(ctx, rp, runID)
	// A failure because the leading call's own context ended is not the
	// store's; one because the store's bound ended the fetch (its error
	// wraps the same deadline error) is, and every waiting call takes it.
	r.leaderEnded = r.err != nil && ctx.Err() != nil
}

// projectRound is one fetch of a run that concurrent projections share.
type projectRound struct {
	done chan struct{}
	snap *RunSnapshot
	err  error
	// leaderEnded: the fetch failed because the context of the call that
	// made it ended; the calls waiting for it fetch again.
	leaderEnded bool
}

// project is one projection of rp; rp.mu is held.
func (p *Projector) project(ctx context.Context, rp *runProjection, runID string) (*RunSnapshot, error) {
	if !rp.gapSince.IsZero() {
		return p.resync(ctx, rp, runID)
	}
	snap := rp.snap
	if snap == nil && p.opts.Durable != nil {
		snap = p.load(ctx, rp, runID)
	}
	var after int64
	if snap != nil {
		after = snap.LastEventSeq
	}
	for {
		recs, err := p.src.Fetch(ctx, runID, after, p.opts.PageSize)
		if err != nil {
			return nil, err
		}
		if len(recs) == 0 {
			break
		}
		if usable, hole := p.contiguousPrefix(after, recs); hole {
			p.observeGap(rp, runID, after, recs[len(usable)].RunSeq)
			return p.resync(ctx, rp, runID)
		}
		snap = p.reduce(ctx, snap, recs)
		rp.lastEventID = recs[len(recs)-1].EventID
		after = recs[len(recs)-1].RunSeq
		if len(recs) < p.opts.PageSize {
			break
		}
	}
	if snap == nil {
		return nil, ErrNotFound
	}
	if rp.lost > 0 {
		snap = markStale(snap)
	}
	rp.snap = snap
	p.save(ctx, rp)
	return snap, nil
}

// load returns runID's persisted snapshot if the log still holds the
// record at its watermark, else nil (the run is then rebuilt from the
// log; a snapshot the log contradicts is deleted and the run marked
// Stale, PROJECTOR_SNAPSHOT_MISMATCH).
func (p *Projector) load(ctx context.Context, rp *runProjection, runID string) *RunSnapshot {
	d, err := p.opts.Durable.LoadSnapshot(ctx, runID)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		p.opts.Metrics.durableSnapshot("error")
		p.log.Debug("persisted snapshot unavailable; projecting from the log", zap.String("runId", runID), zap.Error(err))
		return nil
	}
	if d.Version != DurableSnapshotVersion || d.Snapshot == nil || d.Snapshot.RunID != runID || d.Snapshot.Stale || d.Snapshot.LastEventSeq <= 0 {
		return nil // another version's, or not one this projector would save: rebuilt and saved anew
	}
	w := d.Snapshot.LastEventSeq
	recs, err := p.src.Fetch(ctx, runID, w-1, 1)
	if err != nil {
		return nil // cannot check it: the log is read from the start, and fails the same way if it is down
	}
	if len(recs) == 0 || recs[0].RunSeq != w || recs[0].EventID != d.LastEventID {
		found := "nothing"
		if len(recs) > 0 {
			found = fmt.Sprintf("runSeq %d, eventId %s", recs[0].RunSeq, recs[0].EventID)
		}
		p.discard(ctx, rp, d, zap.String("found", found))
		return nil
	}
	if c, ok := p.opts.Durable.(SnapshotChecker); ok {
		if err := c.CheckSnapshot(ctx, d); errors.Is(err, ErrUnavailable) {
			p.opts.Metrics.durableSnapshot("error")
			p.log.Debug("persisted snapshot not checked; projecting from the log", zap.String("runId", runID), zap.Error(err))
			return nil // cannot check it: projected from the log
		} else if err != nil {
			p.discard(ctx, rp, d, zap.Error(err))
			return nil
		}
	}
	p.opts.Metrics.durableSnapshot("loaded")
	rp.lastEventID, rp.saved = d.LastEventID, d.Snapshot.EventCount
	return d.Snapshot
}

// discard drops a persisted snapshot the log contradicts: the run is
// rebuilt from the log and marked Stale.
func (p *Projector) discard(ctx context.Context, rp *runProjection, d *DurableSnapshot, why zap.Field) {
	runID, w := d.Snapshot.RunID, d.Snapshot.LastEventSeq
	p.opts.Metrics.durableSnapshot("discarded")
	p.log.Error("PROJECTOR_SNAPSHOT_MISMATCH: the log no longer holds the records the persisted snapshot was taken at (restored from an older backup? a record changed or deleted?); rebuilding the run from the log, marked STALE",
		zap.String("code", "PROJECTOR_SNAPSHOT_MISMATCH"), zap.String("runId", runID), zap.Int64("snapshotSeq", w),
		zap.String("snapshotEventId", d.LastEventID), why)
	rp.lost = w
	if err := p.opts.Durable.DeleteSnapshot(ctx, runID); err != nil {
		p.log.Warn("could not delete the contradicted snapshot", zap.String("runId", runID), zap.Error(err))
	}
}

// save persists rp's snapshot when it is SaveEvery records ahead of the
// persisted one, or terminal and not yet saved. A stale snapshot, or one
// of a run with an open gap, is never saved. Best effort: a failed save
// costs a longer replay after a restart, nothing else.
func (p *Projector) save(ctx context.Context, rp *runProjection) {
	snap := rp.snap
	if p.opts.Durable == nil || snap.Stale || !rp.gapSince.IsZero() || rp.lastEventID == "" || snap.EventCount == rp.saved {
		return
	}
	if snap.EventCount-rp.saved < p.opts.SaveEvery && !IsTerminalRunStatus(snap.Status) {
		return
	}
	if err := p.opts.Durable.SaveSnapshot(ctx, &DurableSnapshot{Version: DurableSnapshotVersion, Snapshot: snap, LastEventID: rp.lastEventID}); err != nil {
		p.opts.Metrics.durableSnapshot("error")
		p.log.Debug("could not persist the snapshot", zap.String("runId", snap.RunID), zap.Error(err))
		return
	}
	p.opts.Metrics.durableSnapshot("saved")
	rp.saved = snap.EventCount
}

// resync rebuilds the run's snapshot from all its records.
func (p *Projector) resync(ctx context.Context, rp *runProjection, runID string) (*RunSnapshot, error) {
	var all []RunEventRecord
	var after int64
	for {
		recs, err := p.src.Fetch(ctx, runID, after, p.opts.PageSize)
		if err != nil {
			return nil, err
		}
		all = append(all, recs...)
		if len(recs) < p.opts.PageSize {
			break
		}
		after = recs[len(recs)-1].RunSeq
	}
	usable, hole := p.contiguousPrefix(0, all)
	if !hole && len(all) > 0 && all[len(all)-1].RunSeq >= rp.gapAt {
		p.log.Info("visibility gap closed; resync complete", zap.String("runId", runID), zap.Int64("watermark", all[len(all)-1].RunSeq))
		rp.gapSince, rp.gapAt, rp.accepted = time.Time{}, 0, false
		snap := p.reduce(ctx, nil, all)
		rp.snap, rp.lastEventID, rp.saved = snap, all[len(all)-1].EventID, 0
		p.save(ctx, rp)
		return snap, nil
	}
	if p.opts.Now().Sub(rp.gapSince) >= p.opts.GapGrace {
		if !rp.accepted {
			rp.accepted = true
			p.opts.Metrics.gapAccepted()
			p.log.Error("visibility gap still open after the grace period; applying the records after it, run stays STALE",
				zap.String("runId", runID), zap.Int64("beforeSeq", rp.gapAt), zap.Duration("grace", p.opts.GapGrace))
		}
		usable = all
	}
	snap := p.reduce(ctx, nil, usable)
	if snap == nil {
		return nil, ErrNotFound
	}
	snap = markStale(snap)
	rp.snap = snap
	return snap, nil
}

func markStale(s *RunSnapshot) *RunSnapshot {
	if s.Stale {
		return s
	}
	c := s.Clone()
	c.Stale = true
	return c
}

// contiguousPrefix returns the records that follow after without a hole.
func (p *Projector) contiguousPrefix(after int64, recs []RunEventRecord) ([]RunEventRecord, bool) {
	if !p.opts.Contiguous {
		return recs, false
	}
	prev := after
	for i := range recs {
		if recs[i].RunSeq != prev+1 {
			return recs[:i], true
		}
		prev = recs[i].RunSeq
	}
	return recs, false
}

func (p *Projector) observeGap(rp *runProjection, runID string, last, next int64) {
	if !rp.gapSince.IsZero() {
		return
	}
	rp.gapSince, rp.gapAt = p.opts.Now(), next
	p.opts.Metrics.nonContiguous()
	p.log.Warn("PROJECTOR_NON_CONTIGUOUS_FETCH_DETECTED: run marked STALE, resyncing",
		zap.String("code", "PROJECTOR_NON_CONTIGUOUS_FETCH_DETECTED"),
		zap.String("runId", runID), zap.Int64("lastSeq", last), zap.Int64("nextSeq", next))
}

func (p *Projector) reduce(ctx context.Context, snap *RunSnapshot, recs []RunEventRecord) *RunSnapshot {
	if len(recs) == 0 {
		return snap
	}
	next, alerts := Reduce(snap, recs)
	for _, a := range alerts {
		p.raise(ctx, a)
	}
	if next != snap && len(recs) > 0 {
		p.opts.Metrics.applied(len(recs), p.lag(recs[len(recs)-1].PersistedAt))
	}
	return next
}

func (p *Projector) lag(persistedAt string) time.Duration {
	t, err := time.Parse(time.RFC3339Nano, persistedAt)
	if err != nil {
		return 0
	}
	if d := p.opts.Now().Sub(t); d > 0 {
		return d
	}
	return 0
}

func (p *Projector) raise(ctx context.Context, a InvalidTransitionAlert) {
	k := alertKey{a.RunID, a.EventID}
	p.mu.Lock()
	_, seen := p.alerted[k]
	if !seen {
		p.alerted[k] = struct{}{}
	}
	p.mu.Unlock()
	if seen {
		return
	}
	if p.opts.Gate != nil {
		first, err := p.opts.Gate.First(ctx, a.RunID, a.EventID)
		if err != nil {
			p.log.Warn("alert gate unavailable; raising the alert anyway", zap.String("runId", a.RunID), zap.String("eventId", a.EventID), zap.Error(err))
		} else if !first {
			return
		}
	}
	p.opts.Metrics.invalidTransition()
	p.log.Error("INVALID_TRANSITION: event ignored for state, run marked INCONSISTENT",
		zap.String("code", a.Code), zap.String("runId", a.RunID), zap.String("tenantId", a.TenantID),
		zap.String("projectId", a.ProjectID), zap.String("environmentId", a.EnvironmentID),
		zap.String("eventId", a.EventID), zap.String("eventType", a.EventType), zap.Int64("runSeq", a.RunSeq),
		zap.String("persistedAt", a.PersistedAt), zap.String("stepId", a.StepID),
		zap.String("priorState", a.PriorState), zap.String("attemptedState", a.AttemptedState),
		zap.String("reason", a.Reason))
	if p.opts.Alerts != nil {
		p.opts.Alerts.InvalidTransition(ctx, a)
	}
}

func (p *Projector) run(runID string) *runProjection {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.runs[runID]; ok {
		p.lru.MoveToFront(e)
		return e.Value.(*runProjection)
	}
	rp := &runProjection{runID: runID}
	p.runs[runID] = p.lru.PushFront(rp)
	p.evict()
	p.opts.Metrics.cached(p.lru.Len())
	return rp
}

// Forget drops what the projector keeps in memory of runID, a run that
// leaves hot state; a later read projects it again from the log. A run
// that a projection holds at that moment, or that has an open visibility
// gap, is kept (the least recently used go first, as always).
func (p *Projector) Forget(runID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.runs[runID]
	if !ok {
		return
	}
	p.drop(e)
	p.opts.Metrics.cached(p.lru.Len())
}

// forgetEmpty drops rp, a run whose projection found no event, unless it
// holds a snapshot by now: a read of a run the log does not have (a task
// of another deployment's workflow, a mistyped id) leaves nothing behind
// to take the room of runs that exist.
func (p *Projector) forgetEmpty(rp *runProjection) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.runs[rp.runID]
	if !ok || e.Value.(*runProjection) != rp {
		return
	}
	if !rp.mu.TryLock() {
		return // a projection of it is under way (and may wait for p.mu)
	}
	empty := rp.snap == nil
	rp.mu.Unlock()
	if empty {
		p.drop(e)
		p.opts.Metrics.cached(p.lru.Len())
	}
}

// drop removes e's run unless a projection holds it or it has an open
// visibility gap. p.mu is held.
func (p *Projector) drop(e *list.Element) {
	rp := e.Value.(*runProjection)
	if !rp.mu.TryLock() {
		return
	}
	defer rp.mu.Unlock()
	if !rp.gapSince.IsZero() {
		return
	}
	p.lru.Remove(e)
	delete(p.runs, rp.runID)
	if p.opts.Gate != nil {
		for k := range p.alerted {
			if k.runID == rp.runID {
				delete(p.alerted, k)
			}
		}
	}
}

// evict drops least recently used runs while there are more than MaxRuns,
// skipping a run that a projection holds or that has an open visibility
// gap (its grace period is state the log cannot rebuild). With an alert
// gate, the run's alert keys go too: the gate keeps alerts idempotent.
// p.mu is held.
func (p *Projector) evict() {
	for e := p.lru.Back(); e != nil && p.lru.Len() > p.opts.MaxRuns; {
		prev := e.Prev()
		p.drop(e)
		e = prev
	}
}
