// Package retention moves finished runs out of the sidecar's hot state:
// once a run ended longer ago than its retention period, its records are
// written to the archive, the archive is read back and checked, the run's
// other per-run keys are forgotten, and its records are removed from the
// log. Without retention configured nothing of this runs and nothing is
// removed.
//
// # Order of a removal, and crashes
//
// For each due run: (1) its records are read from the log; (2) unless the
// archive already holds exactly those records, they are written as part of
// a segment, which archive.Write confirms by reading it back and checking
// its hashes; (3) the Forgetters drop the run's keys (snapshot, event ids,
// run list row, ...); (4) the Remover removes its records from the log, up
// to the last archived runSeq. A crash anywhere leaves the run in the log,
// in the archive, or both: after a restart, following the log finds its
// terminal event again (the log still holds it), the archive is found to
// hold the run already, and steps 3 and 4 run again. A run is never
// removed unless the archive holds every record the log has of it up to
// the removed runSeq.
//
// # What is due
//
// Retention follows the log from its start (after retention, the log holds
// only the window, so this reads what is open or recent). A run whose
// terminal event (RunCompleted, RunFailed, RunCancelled) it saw waits in a
// queue ordered by due time: its last record's persistedAt plus its
// tenant's retention period. When due, it is removed only if its records,
// reduced, end it (a terminal status) and no record arrived since;
// otherwise it waits again from its newest record. That read goes around
// the store's projector: archiving a run saves no snapshot of it.
package retention

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/statestore"
)

// Log is what retention reads of the run event log. It reads a due run's
// records and no snapshot: whether the run ended is decided from the
// records it leaves with (statestore.Reduce), not through the store's
// projector, whose read would save the finished run's snapshot only for
// the removal to purge it moments later.
type Log interface {
	statestore.Follower
	Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error)
}

// Archive is where runs go before they leave (an *archive.Archive).
type Archive interface {
	// Write archives runs as one segment and returns once it was read back
	// and checked.
	Write(ctx context.Context, runs []archive.Run) (*archive.Manifest, error)
	// Refresh reads the manifests written since the archive last read
	// them (one listing of the destination); LookupRead returns the entry
	// of runID from the manifests read, without listing, or an error
	// matching archive.ErrRunNotFound.
	Refresh(ctx context.Context) error
	LookupRead(ctx context.Context, runID string) (*archive.RunEntry, error)
	// Records returns the archived records of runID, checked against the
	// manifest.
	Records(ctx context.Context, runID string) ([]statestore.RunEventRecord, error)
	// Head is the newest manifest the archive read or wrote (nil: none);
	// Holds checks the destination holds manifest seq with chain.
	Head() *archive.Manifest
	Holds(ctx context.Context, seq uint64, chain string) error
}

// Remover removes runs' records from the log, each up to its LastRunSeq,
// of which there are Records (natsstore.Remover, on the privileged
// connection; pgstore.Remover, as the retention role). Removing a run
// again is harmless. On an error some of the runs may be removed.
type Remover interface {
	RemoveRuns(ctx context.Context, runs []statestore.Removal) error
}

// HeadKeeper is a Remover that keeps, in hot state, the archive's head
// that its removals were covered by (natsstore.Remover): noted before the
// runs it covers leave, and checked against the archive a process starts
// with, so that runs never leave for an archive that is not the one
// earlier runs went to (an empty directory where the volume is not
// mounted yet, another prefix).
type HeadKeeper interface {
	// ArchiveHead is the head noted (seq 0: none), and whether runs were
	// removed at all.
	ArchiveHead(ctx context.Context) (seq uint64, chain string, removed bool, err error)
	// NoteArchiveHead notes manifest seq (chain) as the head.
	NoteArchiveHead(ctx context.Context, seq uint64, chain string) error
}

// Forgetter drops what a component keeps per run (a bucket's keys, a
// table's rows, an in-memory entry) for a run that leaves hot state.
// ForgetRun of a run it does not know, or forgot before, returns nil. It
// is called before the run's records leave the log, and again after a
// crash, so it must be idempotent.
type Forgetter interface {
	ForgetRun(ctx context.Context, runID string) error
}

// Defaults of Options.
const (
	DefaultInterval  = 10 * time.Second
	DefaultBatchRuns = 200
	// maxBackoff caps the wait after a failed pass.
	maxBackoff = 5 * time.Minute
	// forgetInFlight bounds the runs of a batch whose Forgetters run at
	// once.
	forgetInFlight = 16
)

// Options configures New.
type Options struct {
	// RetainFinished is how long a finished run stays in hot state after
	// its last record (required, > 0).
	RetainFinished time.Duration
	// PerTenant overrides RetainFinished for the tenants it names (> 0).
	PerTenant map[string]time.Duration
	// Interval is how often a pass looks for due runs (default
	// DefaultInterval).
	Interval time.Duration
	// BatchRuns is the most runs one segment holds (default DefaultBatchRuns).
	BatchRuns int
	// Forgetters drop the run's other per-run state, in order.
	Forgetters []Forgetter
	Logger     *zap.Logger
	Metrics    *Metrics
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Retention is the loop that archives and removes finished runs. Open
// starts it; Pass runs one pass (tests, and the loop).
type Retention struct {
	log     Log
	archive Archive
	remover Remover
	opts    Options
	logger  *zap.Logger

	mu    sync.Mutex // one pass at a time; guards the fields below
	tail  statestore.LogTail
	queue runQueue
	byRun map[string]*item
	// headChecked is set once the archive was found to hold the head the
	// remover noted (HeadKeeper); noted is the head noted last.
	headChecked bool
	noted       uint64
	// unsure are the queued runs whose removal was sent and failed: it
	// may have gone through (an answer lost after the commit). One found
	// gone by a later pass counts as removed then. At most the queue's
	// size: a run leaves the set when it is found gone or removed.
	unsure map[string]bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns the loop over log, archive and remover.
func New(log Log, arch Archive, rm Remover, opts Options) (*Retention, error) {
	switch {
	case log == nil || arch == nil || rm == nil:
		return nil, fmt.Errorf("%w: log, archive and remover are required", ErrInvalidOptions)
	case opts.RetainFinished <= 0:
		return nil, fmt.Errorf("%w: the retention period must be positive", ErrInvalidOptions)
	}
	for t, d := range opts.PerTenant {
		if d <= 0 {
			return nil, fmt.Errorf("%w: tenant %q: the retention period must be positive", ErrInvalidOptions, t)
		}
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.BatchRuns <= 0 {
		opts.BatchRuns = DefaultBatchRuns
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Retention{log: log, archive: arch, remover: rm, opts: opts, logger: opts.Logger.Named("retention"), byRun: map[string]*item{}, unsure: map[string]bool{}}, nil
}

// Open starts the loop: a pass every Interval, backing off after failures.
func (r *Retention) Open(ctx context.Context) error {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.loop(ctx)
	}()
	return nil
}

// Close stops the loop and waits for a pass under way, within ctx.
func (r *Retention) Close(ctx context.Context) error {
	if r.cancel != nil {
		r.cancel()
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tail != nil {
		r.tail.Close()
		r.tail = nil
	}
	return nil
}

func (r *Retention) loop(ctx context.Context) {
	wait := r.opts.Interval
	var failing bool
	var lastLog time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		_, err := r.Pass(ctx)
		if errors.Is(err, ErrRunsKept) {
			// The other runs went on: no back-off, but say it.
			if time.Since(lastLog) > time.Minute {
				lastLog = time.Now()
				r.logger.Warn("retention could not remove some runs; they stay whole in the log and are tried again (logged once a minute)",
					zap.String("error", clip(err.Error(), maxLoggedError)))
			}
			err = nil
		}
		switch {
		case err == nil:
			if failing {
				r.logger.Info("retention works again")
				failing = false
			}
			wait = r.opts.Interval
		case errors.Is(err, context.Canceled):
			return
		default:
			failing = true
			wait = min(2*wait, maxBackoff)
			if time.Since(lastLog) > time.Minute {
				lastLog = time.Now()
				r.logger.Warn("retention pass failed; nothing was removed that is not archived, and hot state keeps growing until it works (logged once a minute)", zap.String("error", clip(err.Error(), maxLoggedError)), zap.Duration("retry", wait))
			}
		}
	}
}

// PassResult is what one pass did.
type PassResult struct {
	// Archived runs were written to the archive in this pass; Removed runs
	// left hot state (archived in this pass or before).
	Archived, Removed int
	// Waiting is the number of finished runs not yet due.
	Waiting int
}

// KeptRetry is how long a run that could not be removed waits before it
// is tried again (ErrRunsKept).
const KeptRetry = time.Minute

// Pass reads the log's new records, then archives and removes every due
// run, a segment of up to BatchRuns runs at a time. It stops at the first
// failure of the log, the archive or the removal of a batch, leaving the
// runs it did not finish in the queue, due now. A run whose own keys
// could not be forgotten is put back due after KeptRetry, and the pass
// goes on: it then returns an error matching ErrRunsKept.
func (r *Retention) Pass(ctx context.Context) (PassResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var res PassResult
	if err := r.follow(ctx); err != nil {
		r.opts.Metrics.failed(stepRead)
		return res, err
	}
	var kept error
	for {
		batch, err := r.due(ctx, &res)
		if err != nil {
			// due looks each run up in the archive: a destination that is
			// down fails here first, and must count as the archive failing.
			if ae := (*archive.Error)(nil); errors.As(err, &ae) {
				r.opts.Metrics.failed(stepArchive)
			} else {
				r.opts.Metrics.failed(stepRead)
			}
			return res, err
		}
		if len(batch) == 0 {
			break
		}
		left, err := r.archiveAndRemove(ctx, batch, &res)
		var runErrs runErrors
		if errors.As(err, &runErrs) {
			// Runs of their own: the rest of the batch left, and the
			// pass goes on without them.
			for _, b := range left {
				r.push(b.run.ID, b.tenant, r.opts.Now().Add(KeptRetry))
			}
			kept = errors.Join(kept, err)
			continue
		}
		if err != nil {
			// Put back what was not removed, due now.
			unsure := errors.Is(err, errRemoval)
			for _, b := range left {
				r.push(b.run.ID, b.tenant, r.opts.Now())
				if unsure {
					r.unsure[b.run.ID] = true
				}
			}
			r.opts.Metrics.queue(len(r.queue))
			return res, err
		}
	}
	res.Waiting = len(r.queue)
	r.opts.Metrics.queue(res.Waiting)
	if kept != nil {
		return res, fmt.Errorf("%w (tried again in %s): %w", ErrRunsKept, KeptRetry, kept)
	}
	return res, nil
}

// follow reads the log's new records and queues the runs that ended.
func (r *Retention) follow(ctx context.Context) error {
	if r.tail == nil {
		t, err := r.log.Follow(ctx, 0)
		if err != nil {
			return err
		}
		r.tail = t
	}
	last, err := r.log.LastSeq(ctx)
	if err != nil {
		return err
	}
	for {
		recs, through, err := r.tail.Next(ctx, 1000)
		if err != nil {
			r.tail.Close()
			r.tail = nil // follow anew next pass
			return err
		}
		for i := range recs {
			switch recs[i].EventType {
			case statestore.RunCompleted, statestore.RunFailed, statestore.RunCancelled:
				at, err := time.Parse(time.RFC3339Nano, recs[i].PersistedAt)
				if err != nil {
					at = r.opts.Now()
				}
				r.push(recs[i].RunID, recs[i].TenantID, at.Add(r.retainFor(recs[i].TenantID)))
			}
		}
		if through >= last || len(recs) == 0 {
			return nil
		}
	}
}

func (r *Retention) retainFor(tenant string) time.Duration {
	if d, ok := r.opts.PerTenant[tenant]; ok {
		return d
	}
	return r.opts.RetainFinished
}

// candidate is a due run with the records it leaves with.
type candidate struct {
	run      archive.Run
	tenant   string
	archived bool // the archive already holds exactly these records
}

// due pops due runs and returns up to BatchRuns of them that are ready to
// leave, with their records; runs that are not (not terminal, or a record
// arrived since) wait again or leave the queue.
func (r *Retention) due(ctx context.Context, res *PassResult) ([]candidate, error) {
	now := r.opts.Now()
	var out []candidate
	refreshed := false
	for len(out) < r.opts.BatchRuns && len(r.queue) > 0 && !r.queue[0].due.After(now) {
		if !refreshed {
			// Once a batch, not once a run: a listing of the archive
			// costs what the archive holds (a walk of its manifests, an
			// S3 LIST). It finds the runs a process before this one
			// archived and did not remove; this one's own writes are
			// read as it makes them.
			if err := r.archive.Refresh(ctx); err != nil {
				return out, err
			}
			refreshed = true
		}
		it := heap.Pop(&r.queue).(*item)
		delete(r.byRun, it.runID)
		recs, err := r.log.Fetch(ctx, it.runID, 0, 0)
		if err != nil {
			r.push(it.runID, it.tenant, it.due)
			return out, err
		}
		if len(recs) == 0 {
			// Gone already: by a removal whose answer was lost, counted
			// now, or by another replica's.
			if r.unsure[it.runID] {
				r.opts.Metrics.removedRun()
				res.Removed++
			}
			delete(r.unsure, it.runID)
			continue
		}
		// Ended, as its records say (see Log): the read saves no snapshot.
		if snap, _ := statestore.Reduce(nil, recs); snap == nil || !statestore.IsTerminalRunStatus(snap.Status) {
			continue // a later terminal event queues it again
		}
		last := recs[len(recs)-1]
		if at, err := time.Parse(time.RFC3339Nano, last.PersistedAt); err == nil {
			if d := at.Add(r.retainFor(it.tenant)); d.After(now) {
				r.push(it.runID, it.tenant, d) // a record arrived since
				continue
			}
		}
		c := candidate{run: archive.Run{ID: it.runID, Records: recs}, tenant: it.tenant}
		if c.archived, err = r.alreadyArchived(ctx, c.run); err != nil {
			r.push(it.runID, it.tenant, it.due)
			return out, err
		}
		out = append(out, c)
	}
	return out, nil
}

// alreadyArchived reports whether the archive holds exactly run's records
// (a pass that archived it died before removing it).
func (r *Retention) alreadyArchived(ctx context.Context, run archive.Run) (bool, error) {
	e, err := r.archive.LookupRead(ctx, run.ID)
	if errors.Is(err, archive.ErrRunNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	last := run.Records[len(run.Records)-1]
	if e.Records != int64(len(run.Records)) || e.LastRunSeq != last.RunSeq {
		return false, nil // archived before more records came: archive again
	}
	got, err := r.archive.Records(ctx, run.ID)
	if err != nil {
		return false, err
	}
	if len(got) != len(run.Records) {
		return false, nil
	}
	for i := range got {
		a, errA := archive.EncodeRecord(&got[i])
		b, errB := archive.EncodeRecord(&run.Records[i])
		if errA != nil || errB != nil || string(a) != string(b) {
			return false, nil
		}
	}
	return true, nil
}

// archiveAndRemove writes the batch's runs that are not archived yet as
// one segment, then forgets and removes the batch's runs. It returns the
// runs of the batch it did not remove.
func (r *Retention) archiveAndRemove(ctx context.Context, batch []candidate, res *PassResult) ([]candidate, error) {
	if err := r.checkNotedHead(ctx); err != nil {
		r.opts.Metrics.failed(stepArchive)
		return batch, err
	}
	var write []archive.Run
	for _, c := range batch {
		if !c.archived {
			write = append(write, c.run)
		}
	}
	if len(write) > 0 {
		m, err := r.archive.Write(ctx, write)
		if err != nil {
			r.opts.Metrics.failed(stepArchive)
			return batch, fmt.Errorf("archive %d runs: %w", len(write), err)
		}
		r.opts.Metrics.wrote(len(write), float64(r.opts.Now().Unix()))
		res.Archived += len(write)
		r.logger.Info("archived", zap.Uint64("manifest", m.Seq), zap.Int("runs", len(write)), zap.String("chain", m.Chain))
	}
	if err := r.noteHead(ctx); err != nil {
		r.opts.Metrics.failed(stepArchive)
		return batch, fmt.Errorf("note the archive's head before runs leave: %w", err)
	}
	// Each run's Forgetters, in order, before its records leave; the
	// batch's runs forgetInFlight at a time. A run whose Forgetters failed
	// stays whole in the log; the others are removed.
	forgot := make([]error, len(batch))
	var g errgroup.Group
	g.SetLimit(forgetInFlight)
	for i, c := range batch {
		g.Go(func() error {
			for _, f := range r.opts.Forgetters {
				if err := f.ForgetRun(ctx, c.run.ID); err != nil {
					forgot[i] = fmt.Errorf("remove run %q: %w", c.run.ID, err)
					return nil
				}
			}
			return nil
		})
	}
	_ = g.Wait() // each run's outcome is in forgot
	var removals []statestore.Removal
	var kept []candidate
	for i, c := range batch {
		if forgot[i] != nil {
			kept = append(kept, c)
			continue
		}
		last := c.run.Records[len(c.run.Records)-1].RunSeq
		removals = append(removals, statestore.Removal{RunID: c.run.ID, LastRunSeq: uint64(last), Records: uint64(len(c.run.Records))})
	}
	if len(removals) > 0 {
		if err := r.remover.RemoveRuns(ctx, removals); err != nil {
			// Which of them left is not known: every one is tried again
			// (removing a run again is harmless; a run found gone is
			// counted then, Pass's unsure).
			r.opts.Metrics.failed(stepRemove)
			return batch, fmt.Errorf("%w %d runs: %w", errRemoval, len(removals), err)
		}
		for _, rm := range removals {
			r.opts.Metrics.removedRun()
			delete(r.unsure, rm.RunID)
		}
		res.Removed += len(removals)
	}
	if err := joinRunErrors(forgot); err != nil {
		r.opts.Metrics.failed(stepRemove)
		return kept, err
	}
	return nil, nil
}

// checkNotedHead checks, once per process, that the archive holds the
// head the remover noted (a HeadKeeper): one that does not is not the
// archive earlier runs left for, and takes no run. A store that removed
// runs before heads were noted needs an archive with a manifest.
func (r *Retention) checkNotedHead(ctx context.Context) error {
	hk, ok := r.remover.(HeadKeeper)
	if !ok || r.headChecked {
		return nil
	}
	seq, chain, removed, err := hk.ArchiveHead(ctx)
	if err != nil {
		return fmt.Errorf("read the archive's head noted in hot state: %w", err)
	}
	switch {
	case seq > 0:
		if err := r.archive.Holds(ctx, seq, chain); err != nil {
			return err
		}
	case removed:
		if err := r.archive.Refresh(ctx); err != nil {
			return err
		}
		if r.archive.Head() == nil {
			return &archive.Error{Code: archive.CodeUnavailable, Message: "runs were removed from hot state after they were archived, but the archive holds no manifest: " +
				"it is not the archive they went to (a volume not mounted, another prefix); nothing is archived until it is"}
		}
	}
	r.headChecked = true
	return nil
}

// noteHead notes the archive's head with the remover (a HeadKeeper)
// before runs it covers leave.
func (r *Retention) noteHead(ctx context.Context) error {
	hk, ok := r.remover.(HeadKeeper)
	h := r.archive.Head()
	if !ok || h == nil || h.Seq <= r.noted {
		return nil
	}
	if err := hk.NoteArchiveHead(ctx, h.Seq, h.Chain); err != nil {
		return err
	}
	r.noted = h.Seq
	return nil
}

// errRemoval marks a failed RemoveRuns: its runs may have left.
var errRemoval = errors.New("remove")

// maxLoggedError bounds the error text of a pass-failure line: an error
// from a store or destination may list every run of a batch.
const maxLoggedError = 2048

// clip returns s cut to at most n bytes (at a rune boundary), saying how
// many bytes were left out.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s... (%d bytes more)", s[:n], len(s)-n)
}

// shownRunErrors is how many runs' errors a batch's error spells out; the
// others are counted. A pass failure is logged as one line, and every run
// of a batch fails alike when the store refuses writes.
const shownRunErrors = 3

// runErrors is the errors of a batch's runs. errors.Is and errors.As see
// every one; the message names the first shownRunErrors and counts the
// rest.
type runErrors []error

// joinRunErrors returns the non-nil errors of errs as a runErrors, or nil.
func joinRunErrors(errs []error) error {
	var out runErrors
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (e runErrors) Error() string {
	var b strings.Builder
	for i, err := range e {
		if i == shownRunErrors {
			fmt.Fprintf(&b, "; and %d more", len(e)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

func (e runErrors) Unwrap() []error { return e }

// push queues runID due at due, or moves it later if it is queued earlier.
func (r *Retention) push(runID, tenant string, due time.Time) {
	if it, ok := r.byRun[runID]; ok {
		if due.After(it.due) {
			it.due = due
			heap.Fix(&r.queue, it.index)
		}
		return
	}
	it := &item{runID: runID, tenant: tenant, due: due}
	heap.Push(&r.queue, it)
	r.byRun[runID] = it
}

// item is a finished run waiting for its retention period.
type item struct {
	runID  string
	tenant string
	due    time.Time
	index  int
}

// runQueue is a min-heap of items by due time.
type runQueue []*item

func (q runQueue) Len() int           { return len(q) }
func (q runQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q runQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *runQueue) Push(x any) {
	it := x.(*item)
	it.index = len(*q)
	*q = append(*q, it)
}
func (q *runQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return it
}
