package retention_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/retention"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// hotLog is the log retention works on, as the tests use it: natsstore's
// or pgstore's Store.
type hotLog interface {
	retention.Log
	checkedLog
	Append(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error)
	// ProjectSnapshot is the ordinary read of a run (the API's, the
	// workers'), which retention does not use.
	ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error)
}

// backend is one kind of log the retention suite runs on: every case of
// TestRetention_Pass, TestRetention_CrashAtEachStep and
// TestRetention_KillDashNine runs on each of backends().
type backend struct {
	name string
	// create makes an empty log and returns where it is, as the
	// environment variables open reads (a child process gets them).
	create func(t *testing.T) map[string]string
	// open opens the log that get (a map lookup, or os.Getenv in a
	// child) says where to find, with no runs recorded in the hot.
	open func(t *testing.T, get func(string) string) *hot
	// grace is how long the log's followers wait before they pass the
	// log sequences of a removed run (pgstore.Options.HoleGrace; 0: they
	// do not wait): a restarted pass waits that long for the runs a
	// killed pass removed.
	grace time.Duration
	// seed, when set, adds what must leave the log with a finished run
	// besides its records, and removed checks that it left and that the
	// role serving the log still cannot remove a record.
	seed, removed func(t *testing.T, h *hot)
	// snapshots returns the run snapshots the log keeps saved (the
	// projector's durable ones): a revision by runId, which every save
	// of the run's snapshot changes.
	snapshots func(ctx context.Context, h *hot) (map[string]string, error)
}

// envArchiveDir is where every backend's hot keeps its archive directory.
const envArchiveDir = "RETENTION_ARCHIVE_DIR"

// backends is the list the suite runs on: JetStream always, PostgreSQL
// too (its cases are skipped, saying how to run them, unless
// SIDECAR_TEST_POSTGRES=1 or a PostgreSQL URL is set).
func backends() []*backend { return []*backend{jetStream, postgres} }

func backendNamed(name string) *backend {
	for _, b := range backends() {
		if b.name == name {
			return b
		}
	}
	return nil
}

// eachBackend runs test on every backend, as a subtest named after it.
func eachBackend(t *testing.T, test func(t *testing.T, b *backend)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { test(t, b) })
	}
}

// archiveDir makes the archive's directory under parent, as serve does at
// start (an archive writer never makes it: archive.Dir).
func archiveDir(t *testing.T, parent string) string {
	t.Helper()
	d := archive.NewDir(filepath.Join(parent, "archive"))
	if err := d.CheckWritable(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(parent, "archive")
}

// envNATSDir is the data dir of the JetStream backend's embedded server.
const envNATSDir = "RETENTION_NATS_DIR"

// jetStream is a removable JetStream log on an embedded server, with
// durable snapshots in DefaultSnapshotBucket, whose run keys the remover
// purges with the run (as serve has them).
var jetStream = &backend{
	name: "JetStream",
	create: func(t *testing.T) map[string]string {
		dir := t.TempDir()
		return map[string]string{envNATSDir: filepath.Join(dir, "nats"), envArchiveDir: archiveDir(t, dir)}
	},
	open: func(t *testing.T, get func(string) string) *hot {
		js, srv := natstest.StartIn(t, get(envNATSDir), natsstore.EmbeddedConfig{Logger: zaptest.NewLogger(t)})
		s, err := natsstore.Open(context.Background(), js, natsstore.Options{Removable: true, SnapshotBucket: natsstore.DefaultSnapshotBucket, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		closeLog := func() { once.Do(func() { _ = s.Close(); srv.Shutdown() }) }
		t.Cleanup(closeLog)
		return &hot{t: t, srv: srv, js: js, store: s, dir: get(envArchiveDir), close: closeLog,
			newRemover: func() retention.Remover {
				nc, err := srv.ConnectRetention()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				r, err := natsstore.OpenRemover(context.Background(), js, natsstore.RemoverOptions{Logger: zaptest.NewLogger(t),
					RunKeys: []natsstore.RunKeys{{Bucket: natsstore.DefaultSnapshotBucket, Keys: natsstore.RunKey}}})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}}
	},
	snapshots: func(ctx context.Context, h *hot) (map[string]string, error) {
		kv, err := h.js.KeyValue(ctx, natsstore.DefaultSnapshotBucket)
		if err != nil {
			return nil, err
		}
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		for k := range keys.Keys() {
			e, err := kv.Get(ctx, k)
			if err != nil {
				return nil, fmt.Errorf("snapshot key %s: %w", k, err)
			}
			id, err := natsstore.ParseRunToken(k)
			if err != nil {
				return nil, err
			}
			out[id] = strconv.FormatUint(e.Revision(), 10)
		}
		return out, nil
	},
}

// hot is a log on one backend with finished and open runs in it, and an
// archive directory.
type hot struct {
	t        *testing.T
	srv      *natsstore.Embedded // JetStream only
	js       jetstream.JetStream // JetStream only
	store    hotLog
	finished map[string][]statestore.RunEventRecord
	open     []string
	dir      string
	// close closes the log (and its server); newRemover opens a remover
	// with the retention credential; verify, when set, is the backend's
	// own check of the whole log (sidecar verify).
	close      func()
	newRemover func() retention.Remover
	verify     func()
}

// newHot is newHotOn the JetStream backend.
func newHot(t *testing.T, finished, open int, tenantOf func(i int) string) *hot {
	t.Helper()
	return newHotOn(t, jetStream, finished, open, tenantOf)
}

// newHotOn makes a log on b with finished runs run-0... (RunStarted, a
// step, RunCompleted) and open ones after them (no RunCompleted), of
// tenant tenantOf(i) (nil: tenant_acme).
func newHotOn(t *testing.T, b *backend, finished, open int, tenantOf func(i int) string) *hot {
	t.Helper()
	addr := b.create(t)
	h := b.open(t, func(k string) string { return addr[k] })
	h.populate(finished, open, tenantOf)
	return h
}

// populate appends the runs of newHotOn and keeps the finished runs'
// records.
func (h *hot) populate(finished, open int, tenantOf func(i int) string) {
	h.t.Helper()
	ctx := context.Background()
	if h.finished == nil {
		h.finished = map[string][]statestore.RunEventRecord{}
	}
	for i := range finished + open {
		id := fmt.Sprintf("run-%d", i)
		tenant := "tenant_acme"
		if tenantOf != nil {
			tenant = tenantOf(i)
		}
		events := []*statestore.RunEventWrite{storetest.Event(id, statestore.RunStarted, ""), storetest.Event(id, statestore.StepStarted, "s1"), storetest.Event(id, statestore.StepCompleted, "s1")}
		if i < finished {
			events = append(events, storetest.Event(id, statestore.RunCompleted, ""))
		}
		for _, w := range events {
			w.TenantID = tenant
			if _, err := h.store.Append(ctx, w); err != nil {
				h.t.Fatal(err)
			}
		}
		recs, err := h.store.Fetch(ctx, id, 0, 0)
		if err != nil {
			h.t.Fatal(err)
		}
		if i < finished {
			h.finished[id] = recs
		} else {
			h.open = append(h.open, id)
		}
	}
}

func (h *hot) remover() retention.Remover {
	h.t.Helper()
	return h.newRemover()
}

func (h *hot) archive(dest archive.Destination) *archive.Archive {
	h.t.Helper()
	if dest == nil {
		dest = archive.NewDir(h.dir)
	}
	a, err := archive.Open(context.Background(), dest, archive.Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

// retention is a fresh loop (as after a restart) on the hot log, by
// default with a retention period of one hour and its clock two hours
// ahead.
func (h *hot) retention(arch retention.Archive, rm retention.Remover, opts retention.Options) *retention.Retention {
	h.t.Helper()
	if opts.RetainFinished == 0 {
		opts.RetainFinished = time.Hour
	}
	if opts.Now == nil {
		opts.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	}
	opts.Logger = zaptest.NewLogger(h.t)
	r, err := retention.New(h.store, arch, rm, opts)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { r.Close(context.Background()) })
	return r
}

// requireSafe checks the invariant after any crash: every finished run is
// whole in the log, or whole and verified in the archive, or both; open
// runs are whole in the log; the log verifies (and passes the backend's
// own check).
func (h *hot) requireSafe(wantRemoved bool) {
	h.t.Helper()
	requireSafe(h.t, h.store, h.dir, h.finished, h.open, wantRemoved)
	if h.verify != nil {
		h.verify()
	}
}

// checkedLog is a log whose integrity check requireSafe runs.
type checkedLog interface {
	Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error)
	Check(ctx context.Context) error
}

// requireSafe is hot.requireSafe on any log: finished are the finished
// runs' records, open the open runs (3 records each), dir the archive.
func requireSafe(t *testing.T, log checkedLog, dir string, finished map[string][]statestore.RunEventRecord, open []string, wantRemoved bool) {
	t.Helper()
	ctx := context.Background()
	// A crash may come before the first manifest (an empty archive), or
	// before the first object (no directory: the writer makes it then).
	rep, err := archive.Verify(ctx, archive.NewDir(dir), archive.VerifyOptions{AllowEmpty: true})
	_, serr := os.Stat(dir)
	switch {
	case errors.Is(serr, fs.ErrNotExist):
	case err != nil:
		t.Fatal(err)
	case len(rep.Problems) != 0:
		t.Fatalf("archive does not verify: %+v", rep.Problems)
	}
	a, err := archive.Open(ctx, archive.NewDir(dir), archive.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range finished {
		got, err := log.Fetch(ctx, id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		inHot := reflect.DeepEqual(got, want)
		arch, err := a.Records(ctx, id)
		inArchive := err == nil && reflect.DeepEqual(arch, want)
		if err != nil && !errors.Is(err, archive.ErrRunNotFound) {
			t.Fatal(err)
		}
		switch {
		case !inHot && !inArchive:
			t.Fatalf("run %s is neither whole in the log (%d of %d records) nor in the archive", id, len(got), len(want))
		case !inHot && len(got) != 0:
			t.Fatalf("run %s is partly in the log: %d of %d records", id, len(got), len(want))
		case wantRemoved && (len(got) != 0 || !inArchive):
			t.Fatalf("run %s: %d records in the log, archived %v; want removed and archived", id, len(got), inArchive)
		}
	}
	for _, id := range open {
		if got, _ := log.Fetch(ctx, id, 0, 0); len(got) != 3 {
			t.Fatalf("open run %s has %d records, want 3", id, len(got))
		}
	}
	if err := log.Check(ctx); err != nil {
		t.Fatalf("the log does not verify: %v", err)
	}
}

// TestRetention_Pass: a pass archives every finished run that is due,
// the archive verifies, and the runs leave the log (on PostgreSQL through
// the retention role, with their snapshots and event ids, the role that
// serves the log still unable to delete a record); open runs, runs not
// due yet and, while the archive is down, every run stay.
func TestRetention_Pass(t *testing.T) {
	eachBackend(t, testPass)
}

func testPass(t *testing.T, b *backend) {
	ctx := context.Background()
	t.Run("OK", func(t *testing.T) {
		h := newHotOn(t, b, 5, 2, nil)
		if b.seed != nil {
			b.seed(t, h)
		}
		reg := prometheus.NewRegistry()
		r := h.retention(h.archive(nil), h.remover(), retention.Options{BatchRuns: 2, Metrics: retention.NewMetrics(reg)})
		res, err := r.Pass(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Archived != 5 || res.Removed != 5 || res.Waiting != 0 {
			t.Fatalf("got %+v, want 5 archived and removed", res)
		}
		h.requireSafe(true)
		if got := testutil.ToFloat64(mustGauge(t, reg, "sidecar_retention_runs_removed_total")); got != 5 {
			t.Fatalf("removed metric %v", got)
		}
		rep, err := archive.Verify(ctx, archive.NewDir(h.dir), archive.VerifyOptions{})
		if err != nil || len(rep.Problems) != 0 || rep.Runs != 5 || rep.Records != 20 {
			t.Fatalf("archive verify: %+v %v, want 5 runs, 20 records", rep, err)
		}
		if b.removed != nil {
			b.removed(t, h)
		}
		// A second pass finds nothing to do.
		if res, err := r.Pass(ctx); err != nil || res.Archived+res.Removed != 0 {
			t.Fatalf("second pass: %+v %v", res, err)
		}
	})
	t.Run("NotDueYet", func(t *testing.T) {
		h := newHotOn(t, b, 3, 0, nil)
		r := h.retention(h.archive(nil), h.remover(), retention.Options{Now: time.Now})
		res, err := r.Pass(ctx)
		if err != nil || res.Removed != 0 || res.Waiting != 3 {
			t.Fatalf("got %+v %v, want 3 waiting", res, err)
		}
		h.requireSafe(false)
		for id, want := range h.finished {
			if got, _ := h.store.Fetch(ctx, id, 0, 0); len(got) != len(want) {
				t.Fatalf("run %s removed before it was due", id)
			}
		}
	})
	t.Run("PerTenant", func(t *testing.T) {
		h := newHotOn(t, b, 4, 0, func(i int) string { return []string{"short", "long"}[i%2] })
		r := h.retention(h.archive(nil), h.remover(), retention.Options{RetainFinished: 1000 * time.Hour, PerTenant: map[string]time.Duration{"short": time.Hour}})
		res, err := r.Pass(ctx)
		if err != nil || res.Removed != 2 || res.Waiting != 2 {
			t.Fatalf("got %+v %v, want the 2 runs of tenant short removed", res, err)
		}
		for id := range h.finished {
			got, _ := h.store.Fetch(ctx, id, 0, 0)
			if short := h.finished[id][0].TenantID == "short"; short != (len(got) == 0) {
				t.Fatalf("run %s of tenant %s has %d records", id, h.finished[id][0].TenantID, len(got))
			}
		}
		h.requireSafe(false)
	})
	t.Run("ArchiveDownRemovesNothing", func(t *testing.T) {
		h := newHotOn(t, b, 3, 1, nil)
		down := &downDest{Dir: archive.NewDir(h.dir), down: true}
		reg := prometheus.NewRegistry()
		rm := h.remover()
		r := h.retention(h.archive(down), rm, retention.Options{Metrics: retention.NewMetrics(reg)})
		if _, err := r.Pass(ctx); !errors.Is(err, archive.ErrUnavailable) {
			t.Fatalf("got %v, want ErrUnavailable", err)
		}
		for id, want := range h.finished {
			if got, _ := h.store.Fetch(ctx, id, 0, 0); len(got) != len(want) {
				t.Fatalf("run %s lost records while the archive was down", id)
			}
		}
		if got := testutil.ToFloat64(mustGauge(t, reg, "sidecar_archive_failing")); got != 1 {
			t.Fatalf("sidecar_archive_failing = %v, want 1", got)
		}
		down.down = false
		if res, err := r.Pass(ctx); err != nil || res.Removed != 3 {
			t.Fatalf("after the archive came back: %+v %v", res, err)
		}
		if got := testutil.ToFloat64(mustGauge(t, reg, "sidecar_archive_failing")); got != 0 {
			t.Fatalf("sidecar_archive_failing = %v, want 0", got)
		}
		h.requireSafe(true)
	})
	t.Run("InvalidOptions", func(t *testing.T) {
		h := newHotOn(t, b, 0, 0, nil)
		for _, opts := range []retention.Options{{}, {RetainFinished: -time.Second}, {RetainFinished: time.Hour, PerTenant: map[string]time.Duration{"x": 0}}} {
			if _, err := retention.New(h.store, h.archive(nil), h.remover(), opts); !errors.Is(err, retention.ErrInvalidOptions) {
				t.Errorf("%+v: got %v, want ErrInvalidOptions", opts, err)
			}
		}
	})
}

// TestRetention_CrashAtEachStep stops a pass after each step (as kill -9
// would: everything retention keeps is in the log, the archive and the
// ledger), then runs a fresh loop as after a restart: no run is lost at
// any point, and the fresh loop finishes the job without archiving a run
// twice.
func TestRetention_CrashAtEachStep(t *testing.T) {
	eachBackend(t, testCrashAtEachStep)
}

func testCrashAtEachStep(t *testing.T, b *backend) {
	ctx := context.Background()
	crash := errors.New("crash")
	// The steps inside a removal (ledger pending, purged) are
	// natsstore's TestRemover_CrashAtEachStep.
	for _, step := range []string{"segment-written", "manifest-written", "archive-confirmed", "forgotten", "removal-starting", "removed"} {
		t.Run(step, func(t *testing.T) {
			h := newHotOn(t, b, 4, 1, nil)
			dest := &downDest{Dir: archive.NewDir(h.dir)}
			arch := h.archive(dest)
			var a retention.Archive = arch
			var rm retention.Remover = h.remover()
			var forget []retention.Forgetter
			switch step {
			case "segment-written":
				dest.failPutNew = crash // the manifest is never written
			case "manifest-written":
				dest.failGetManifest = crash // written, not read back
			case "archive-confirmed":
				a = crashAfterWrite{arch, crash}
			case "forgotten":
				forget = []retention.Forgetter{forgetFunc(func(context.Context, string) error { return crash })}
			case "removal-starting":
				rm = crashRemover{rm, crash, false}
			case "removed":
				rm = crashRemover{rm, crash, true}
			}
			r := h.retention(a, rm, retention.Options{Forgetters: forget})
			if _, err := r.Pass(ctx); !errors.Is(err, crash) {
				t.Fatalf("got %v, want the crash", err)
			}
			r.Close(ctx)
			h.requireSafe(false)
			restart(t, h, b)
			rep, err := archive.Verify(ctx, archive.NewDir(h.dir), archive.VerifyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Runs != 4 || rep.Records != 16 {
				t.Fatalf("archive holds %d runs, %d records; want 4 and 16 (no run twice)", rep.Runs, rep.Records)
			}
		})
	}
}

// restart is what a process started after a crash or a kill does: once
// the log's followers pass the removed runs (b.grace), a fresh archive,
// remover (which finishes a pending removal) and loop make a pass; every
// finished run then is archived and gone from the log.
func restart(t *testing.T, h *hot, b *backend) {
	t.Helper()
	if b.grace > 0 {
		time.Sleep(b.grace + 200*time.Millisecond) // the removed runs' records are older than the grace
	}
	if _, err := h.retention(h.archive(nil), h.remover(), retention.Options{}).Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.requireSafe(true)
}

func mustGauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			v := mf.GetMetric()[0]
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
			if v.Gauge != nil {
				g.Set(v.Gauge.GetValue())
			} else {
				g.Set(v.Counter.GetValue())
			}
			return g
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// downDest is a directory that can be down, or fail one kind of call.
type downDest struct {
	*archive.Dir
	down            bool
	failPutNew      error
	failGetManifest error
}

func (d *downDest) Put(ctx context.Context, name string, b []byte) error {
	if d.down {
		return &archive.Error{Code: archive.CodeUnavailable, Message: "down"}
	}
	return d.Dir.Put(ctx, name, b)
}

func (d *downDest) PutNew(ctx context.Context, name string, b []byte) error {
	if d.down {
		return &archive.Error{Code: archive.CodeUnavailable, Message: "down"}
	}
	if d.failPutNew != nil {
		return d.failPutNew
	}
	return d.Dir.PutNew(ctx, name, b)
}

func (d *downDest) Get(ctx context.Context, name string, limit int64) ([]byte, error) {
	if d.down {
		return nil, &archive.Error{Code: archive.CodeUnavailable, Message: "down"}
	}
	if d.failGetManifest != nil && filepath.Dir(name) == "manifests" {
		if b, err := d.Dir.Get(ctx, name, limit); err == nil && len(b) > 0 {
			return nil, d.failGetManifest
		}
	}
	return d.Dir.Get(ctx, name, limit)
}

// crashAfterWrite confirms the write, then fails as if the process died.
type crashAfterWrite struct {
	*archive.Archive
	crash error
}

func (c crashAfterWrite) Write(ctx context.Context, runs []archive.Run) (*archive.Manifest, error) {
	if _, err := c.Archive.Write(ctx, runs); err != nil {
		return nil, err
	}
	return nil, c.crash
}

type forgetFunc func(context.Context, string) error

func (f forgetFunc) ForgetRun(ctx context.Context, runID string) error { return f(ctx, runID) }

// crashRemover dies before a removal starts, or right after it finished.
type crashRemover struct {
	retention.Remover
	crash error
	after bool
}

func (c crashRemover) RemoveRuns(ctx context.Context, runs []statestore.Removal) error {
	if !c.after {
		return c.crash
	}
	if err := c.Remover.RemoveRuns(ctx, runs); err != nil {
		return err
	}
	return c.crash
}

// TestRetention_ARunThatCannotBeRemovedHoldsUpNoOther: a run whose removal
// fails (one of its per-run keys cannot be forgotten) stays whole in the
// log and is tried again a minute later; the pass goes on with the other
// due runs, and the next pass is not delayed by it (errors.Is
// ErrRunsKept, which the loop does not back off for).
func TestRetention_ARunThatCannotBeRemovedHoldsUpNoOther(t *testing.T) {
	ctx := context.Background()
	h := newHot(t, 5, 0, nil)
	fail := true
	stuck := forgetFunc(func(_ context.Context, runID string) error {
		if runID == "run-0" && fail {
			return errors.New("its key cannot be purged")
		}
		return nil
	})
	now := time.Now().Add(2 * time.Hour)
	r := h.retention(h.archive(nil), h.remover(), retention.Options{BatchRuns: 1, Forgetters: []retention.Forgetter{stuck},
		Now: func() time.Time { return now }})
	res, err := r.Pass(ctx)
	if !errors.Is(err, retention.ErrRunsKept) || res.Removed != 4 {
		t.Fatalf("pass: %+v %v; want the 4 other runs removed and ErrRunsKept for run-0", res, err)
	}
	if recs, _ := h.store.Fetch(ctx, "run-0", 0, 0); len(recs) != len(h.finished["run-0"]) {
		t.Fatalf("run-0 has %d records, want it whole", len(recs))
	}
	if res, err := r.Pass(ctx); err != nil || res.Removed != 0 || res.Waiting != 1 {
		t.Fatalf("pass at once: %+v %v; want run-0 waiting for its retry", res, err)
	}
	fail = false
	now = now.Add(time.Minute + time.Second)
	if res, err := r.Pass(ctx); err != nil || res.Removed != 1 {
		t.Fatalf("pass a minute later: %+v %v; want run-0 removed", res, err)
	}
	h.requireSafe(true)
}

// TestRetention_ARemovalWhoseAnswerWasLostIsCounted: a batch whose
// removal went through but failed to answer (the store's connection cut
// after the commit) is found gone by the next pass, which counts its runs
// as removed: sidecar_retention_runs_removed_total matches the runs that
// left.
func TestRetention_ARemovalWhoseAnswerWasLostIsCounted(t *testing.T) {
	ctx := context.Background()
	h := newHot(t, 4, 0, nil)
	reg := prometheus.NewRegistry()
	metrics := retention.NewMetrics(reg)
	lost := errors.New("connection cut after the commit")
	r := h.retention(h.archive(nil), crashRemover{h.remover(), lost, true}, retention.Options{Metrics: metrics})
	if _, err := r.Pass(ctx); !errors.Is(err, lost) {
		t.Fatalf("got %v, want the lost answer", err)
	}
	h.requireSafe(true) // they did leave
	res, err := r.Pass(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(mustGauge(t, reg, "sidecar_retention_runs_removed_total")); got != 4 || res.Removed != 4 {
		t.Fatalf("after the next pass: %v runs counted removed (pass %+v), want 4", got, res)
	}
	if res, err := r.Pass(ctx); err != nil || res.Removed != 0 {
		t.Fatalf("a pass after that: %+v %v, want nothing more counted", res, err)
	}
}
