package statestore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/memstore"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// hidingFetcher is a test store that hides a committed record (a visibility
// gap) until it is released: the one fault a real backend cannot be made to
// show on demand. It wraps the real memstore.
type hidingFetcher struct {
	inner *memstore.Store
	mu    sync.Mutex
	hide  map[int64]bool
	// stride multiplies runSeqs, to model a store gappy by design.
	stride int64
}

func (h *hidingFetcher) Fetch(ctx context.Context, runID string, after int64, limit int) ([]statestore.RunEventRecord, error) {
	stride := h.stride
	if stride == 0 {
		stride = 1
	}
	recs, err := h.inner.Fetch(ctx, runID, after/stride, 0)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []statestore.RunEventRecord
	for _, r := range recs {
		r.RunSeq *= stride
		if r.RunSeq <= after || h.hide[r.RunSeq] {
			continue
		}
		out = append(out, r)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out, nil
}

func (h *hidingFetcher) release(seq int64) {
	h.mu.Lock()
	delete(h.hide, seq)
	h.mu.Unlock()
}

type alertRecorder struct {
	mu     sync.Mutex
	alerts []statestore.InvalidTransitionAlert
}

func (a *alertRecorder) InvalidTransition(_ context.Context, al statestore.InvalidTransitionAlert) {
	a.mu.Lock()
	a.alerts = append(a.alerts, al)
	a.mu.Unlock()
}

func appendAll(t *testing.T, s statestore.Store, ws ...*statestore.RunEventWrite) {
	t.Helper()
	for _, w := range ws {
		if _, err := s.Append(context.Background(), w); err != nil {
			t.Fatal(err)
		}
	}
}

func TestProjector_VisibilityGap(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	appendAll(t, mem,
		storetest.Event("r", statestore.RunStarted, ""),
		storetest.Event("r", statestore.StepStarted, "a"),
		storetest.Event("r", statestore.StepStarted, "b"),
		storetest.Event("r", statestore.StepCompleted, "a"))
	src := &hidingFetcher{inner: mem, hide: map[int64]bool{3: true}}
	reg := prometheus.NewRegistry()
	metrics := statestore.NewMetrics(reg)
	now := time.Now()
	clock := func() time.Time { return now }
	p := statestore.NewProjector(src, statestore.ProjectorOptions{Contiguous: true, Metrics: metrics, Logger: zaptest.NewLogger(t), Now: clock})

	s, err := p.Project(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if !s.Stale || s.LastEventSeq != 2 || s.Step("b") != nil {
		t.Fatalf("gap at 3: stale=%v watermark=%d (records after the hole must be held back)", s.Stale, s.LastEventSeq)
	}
	if got := metricValue(t, reg, "sidecar_projector_non_contiguous_fetch_total"); got != 1 {
		t.Fatalf("non-contiguous counter %v, want 1", got)
	}
	// Still hidden: stays stale, the gap is counted once.
	s, _ = p.Project(ctx, "r")
	if !s.Stale || s.LastEventSeq != 2 {
		t.Fatalf("second projection: stale=%v watermark=%d", s.Stale, s.LastEventSeq)
	}
	if got := metricValue(t, reg, "sidecar_projector_non_contiguous_fetch_total"); got != 1 {
		t.Fatalf("non-contiguous counter %v, want 1", got)
	}
	// The record becomes visible: resync passes the hole and clears STALE.
	src.release(3)
	s, _ = p.Project(ctx, "r")
	if s.Stale || s.LastEventSeq != 4 || s.Step("b").Status != statestore.StepStatusRunning || s.Step("a").Status != statestore.StepStatusSuccess {
		t.Fatalf("after release: stale=%v watermark=%d", s.Stale, s.LastEventSeq)
	}
	if got, _ := p.Snapshot(ctx, "r"); got != s {
		t.Fatal("Snapshot does not return the cached projection")
	}
}

func TestProjector_GapNeverClosing(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	appendAll(t, mem, storetest.Event("r", statestore.RunStarted, ""), storetest.Event("r", statestore.StepStarted, "a"), storetest.Event("r", statestore.StepStarted, "b"))
	src := &hidingFetcher{inner: mem, hide: map[int64]bool{2: true}}
	reg := prometheus.NewRegistry()
	now := time.Now()
	p := statestore.NewProjector(src, statestore.ProjectorOptions{Contiguous: true, Metrics: statestore.NewMetrics(reg),
		GapGrace: time.Minute, Now: func() time.Time { return now }})
	if s, _ := p.Project(ctx, "r"); !s.Stale || s.LastEventSeq != 1 {
		t.Fatalf("stale=%v watermark=%d", s.Stale, s.LastEventSeq)
	}
	now = now.Add(2 * time.Minute)
	s, _ := p.Project(ctx, "r")
	if !s.Stale || s.LastEventSeq != 3 || s.Step("b") == nil {
		t.Fatalf("after the grace period: stale=%v watermark=%d, want the records after the hole applied and STALE kept", s.Stale, s.LastEventSeq)
	}
	p.Project(ctx, "r")
	if got := metricValue(t, reg, "sidecar_projector_gaps_accepted_total"); got != 1 {
		t.Fatalf("gaps accepted %v, want 1", got)
	}
	// The hidden record shows up late: it is applied, not skipped.
	src.release(2)
	s, _ = p.Project(ctx, "r")
	if s.Stale || s.Step("a") == nil || s.LastEventSeq != 3 {
		t.Fatalf("late record: stale=%v step a=%v", s.Stale, s.Step("a"))
	}
}

func TestProjector_GappyByDesignNoResync(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	src := &hidingFetcher{inner: mem, stride: 7} // runSeqs 7, 14, 21, ...
	reg := prometheus.NewRegistry()
	p := statestore.NewProjector(src, statestore.ProjectorOptions{Contiguous: false, Metrics: statestore.NewMetrics(reg), PageSize: 2})
	appendAll(t, mem, storetest.Event("r", statestore.RunStarted, ""), storetest.Event("r", statestore.StepStarted, "a"))
	s, _ := p.Project(ctx, "r")
	appendAll(t, mem, storetest.Event("r", statestore.StepCompleted, "a"), storetest.Event("r", statestore.StepStarted, "b"), storetest.Event("r", statestore.StepStarted, "c"))
	s, _ = p.Project(ctx, "r")
	if s.Stale || s.LastEventSeq != 35 || len(s.Steps) != 3 {
		t.Fatalf("stale=%v watermark=%d steps=%d", s.Stale, s.LastEventSeq, len(s.Steps))
	}
	if got := metricValue(t, reg, "sidecar_projector_non_contiguous_fetch_total"); got != 0 {
		t.Fatalf("gaps by design raised %v non-contiguous detections", got)
	}
}

func TestProjector_AlertOncePerEvent(t *testing.T) {
	ctx := context.Background()
	rec := &alertRecorder{}
	reg := prometheus.NewRegistry()
	mem := memstore.New(statestore.ProjectorOptions{})
	appendAll(t, mem, storetest.Event("r", statestore.RunStarted, ""), storetest.Event("r", statestore.RunCompleted, ""),
		storetest.Event("r", statestore.RunPaused, ""))
	src := &hidingFetcher{inner: mem}
	p := statestore.NewProjector(src, statestore.ProjectorOptions{Alerts: rec, Metrics: statestore.NewMetrics(reg), Contiguous: true})
	if _, err := p.Project(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	// A later hole forces a resync from scratch, which reduces the invalid
	// event again: no second alert.
	appendAll(t, mem, storetest.Event("r", "RunAnnotated", ""), storetest.Event("r", "RunNoted", ""))
	src.mu.Lock()
	src.hide = map[int64]bool{4: true}
	src.mu.Unlock()
	p.Project(ctx, "r")
	src.release(4)
	s, _ := p.Project(ctx, "r")
	// A second projector (another replica) alerts on its own; within one it is once.
	if len(rec.alerts) != 1 || rec.alerts[0].EventType != statestore.RunPaused || !s.Inconsistent || s.Status != statestore.RunStatusCompleted {
		t.Fatalf("alerts %+v inconsistent %v status %s", rec.alerts, s.Inconsistent, s.Status)
	}
	if got := metricValue(t, reg, "sidecar_projector_invalid_transitions_total"); got != 1 {
		t.Fatalf("invalid transitions counter %v", got)
	}
}

func TestProjector_LagMetric(t *testing.T) {
	mem := memstore.New(statestore.ProjectorOptions{})
	mem.Now = func() time.Time { return time.Now().Add(-7 * time.Second) }
	appendAll(t, mem, storetest.Event("r", statestore.RunStarted, ""))
	reg := prometheus.NewRegistry()
	p := statestore.NewProjector(mem, statestore.ProjectorOptions{Metrics: statestore.NewMetrics(reg)})
	if _, err := p.Project(context.Background(), "r"); err != nil {
		t.Fatal(err)
	}
	if lag := metricValue(t, reg, "sidecar_projector_lag_seconds"); lag < 6.5 || lag > 60 {
		t.Fatalf("lag %v, want about 7s", lag)
	}
}

func TestProjector_NotFoundAndErrors(t *testing.T) {
	p := statestore.NewProjector(memstore.New(statestore.ProjectorOptions{}), statestore.ProjectorOptions{})
	if _, err := p.Snapshot(context.Background(), "nope"); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Project(ctx, "nope"); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}

// metricValue returns the value of the unlabelled counter or gauge name.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) != 1 {
			continue
		}
		m := mf.GetMetric()[0]
		if m.Counter != nil {
			return m.Counter.GetValue()
		}
		return m.Gauge.GetValue()
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// memGate is an in-memory AlertGate shared by several projectors, standing
// in for a shared KV bucket (natsstore has the JetStream one and its test).
type memGate struct {
	mu   sync.Mutex
	seen map[string]bool
	err  error
}

func (g *memGate) First(_ context.Context, runID, eventID string) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return false, g.err
	}
	k := runID + "\x00" + eventID
	if g.seen[k] {
		return false, nil
	}
	g.seen[k] = true
	return true, nil
}

func TestProjector_AlertGateAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	appendAll(t, mem, storetest.Event("r", statestore.RunStarted, ""), storetest.Event("r", statestore.RunCompleted, ""),
		storetest.Event("r", statestore.RunPaused, ""))
	gate := &memGate{seen: map[string]bool{}}
	rec := &alertRecorder{}
	for i := 0; i < 3; i++ { // three replicas, or one process restarted twice
		p := statestore.NewProjector(mem, statestore.ProjectorOptions{Alerts: rec, Gate: gate})
		if _, err := p.Project(ctx, "r"); err != nil {
			t.Fatal(err)
		}
	}
	if len(rec.alerts) != 1 {
		t.Fatalf("%d alerts across replicas, want 1", len(rec.alerts))
	}
	gate.err = errors.New("kv down")
	p := statestore.NewProjector(mem, statestore.ProjectorOptions{Alerts: rec, Gate: gate})
	p.Project(ctx, "r")
	if len(rec.alerts) != 2 {
		t.Fatalf("with the gate down the alert must still be raised: %d alerts", len(rec.alerts))
	}
}

// TestProjector_EvictsLeastRecentlyUsed: the projector keeps at most
// MaxRuns runs (its cache never evicted before), and a run it
// dropped is rebuilt from the log with the same snapshot.
func TestProjector_EvictsLeastRecentlyUsed(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	p := statestore.NewProjector(mem, statestore.ProjectorOptions{MaxRuns: 4})
	want := map[string]*statestore.RunSnapshot{}
	for i := range 10 {
		runID := fmt.Sprintf("run-%d", i)
		for _, w := range []*statestore.RunEventWrite{
			storetest.Event(runID, statestore.RunStarted, ""),
			storetest.Event(runID, statestore.StepStarted, "a"),
			storetest.Event(runID, statestore.StepCompleted, "a"),
		} {
			if _, err := mem.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		snap, err := p.Project(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		want[runID] = snap
		if n := p.CachedRuns(); n > 4 {
			t.Fatalf("after %d runs the projector keeps %d, want at most 4", i+1, n)
		}
	}
	for runID, w := range want {
		got, err := p.Snapshot(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("%s rebuilt after eviction:\n got %+v\nwant %+v", runID, got, w)
		}
	}
}

// slowFetcher is the real memstore behind a fetch that takes delay, as a
// remote store's read does.
type slowFetcher struct {
	inner *memstore.Store
	delay time.Duration
}

func (s *slowFetcher) Fetch(ctx context.Context, runID string, after int64, limit int) ([]statestore.RunEventRecord, error) {
	time.Sleep(s.delay)
	return s.inner.Fetch(ctx, runID, after, limit)
}

// Concurrent reads of one run share a fetch: N readers that arrive while a
// fetch is in flight wait for one next fetch, not for N fetches in a row.
func TestProjector_ConcurrentReadsShareAFetch(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	appendAll(t, mem,
		storetest.Event("r", statestore.RunStarted, ""),
		storetest.Event("r", statestore.StepStarted, "a"))
	const readers, delay = 16, 200 * time.Millisecond
	p := statestore.NewProjector(&slowFetcher{inner: mem, delay: delay}, statestore.ProjectorOptions{})
	if _, err := p.Project(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := p.Project(ctx, "r")
			if err == nil && s.LastEventSeq != 2 {
				err = fmt.Errorf("watermark %d, want 2", s.LastEventSeq)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	took := time.Since(began)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// One fetch after another would take at least readers*delay (3.2 s);
	// shared, a few fetches do.
	if took >= readers*delay/2 {
		t.Fatalf("%d concurrent reads of one run took %v with a fetch of %v: the reads fetched one after another", readers, took, delay)
	}
}

// heldFetcher is the real memstore behind a fetch that, once armed, reads
// the log and then waits to be released before it answers: a fetch in
// flight while records are appended.
type heldFetcher struct {
	inner   *memstore.Store
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (h *heldFetcher) Fetch(ctx context.Context, runID string, after int64, limit int) ([]statestore.RunEventRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	recs, err := h.inner.Fetch(ctx, runID, after, limit)
	h.mu.Lock()
	hold := h.armed
	h.armed = false
	h.mu.Unlock()
	if hold {
		close(h.entered)
		<-h.release
		if err := ctx.Err(); err != nil {
			return nil, err // a store's read ends with its caller's context
		}
	}
	return recs, err
}

// A read never misses a record appended before it started, even when it
// arrives while a fetch that began before that append is in flight: it
// waits for a fetch that starts after it arrived (the fence and the task
// proxy's gate rely on this).
func TestProjector_ReadSeesRecordsAppendedBeforeIt(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	appendAll(t, mem, storetest.Event("r", statestore.RunStarted, ""))
	src := &heldFetcher{inner: mem, entered: make(chan struct{}), release: make(chan struct{})}
	p := statestore.NewProjector(src, statestore.ProjectorOptions{})
	if _, err := p.Project(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	src.armed = true
	src.mu.Unlock()
	first := make(chan *statestore.RunSnapshot, 1)
	go func() {
		s, _ := p.Project(ctx, "r")
		first <- s
	}()
	select {
	case <-src.entered:
	case <-time.After(2 * time.Minute):
		t.Fatal("the first read never fetched")
	}
	appendAll(t, mem, storetest.Event("r", statestore.StepStarted, "a"))
	const readers = 4
	later := make(chan *statestore.RunSnapshot, readers)
	for range readers {
		go func() {
			s, err := p.Project(ctx, "r")
			if err != nil {
				t.Error(err)
			}
			later <- s
		}()
	}
	// Let the later reads arrive while the first fetch is held.
	time.Sleep(200 * time.Millisecond)
	close(src.release)
	if s := <-first; s == nil || s.LastEventSeq != 1 {
		t.Fatalf("the held fetch read the log before the append: got %+v", s)
	}
	for range readers {
		s := <-later
		if s == nil || s.LastEventSeq != 2 || s.Step("a") == nil {
			t.Fatalf("a read that started after StepStarted was appended did not see it: %+v", s)
		}
	}
}

// A read that waits for a shared fetch is not failed by the context of the
// call that makes the fetch: when that call's context ended, the read
// fetches again with its own.
func TestProjector_SharedFetchOutlivesItsCaller(t *testing.T) {
	mem := memstore.New(statestore.ProjectorOptions{})
	appendAll(t, mem, storetest.Event("r", statestore.RunStarted, ""))
	src := &heldFetcher{inner: mem, entered: make(chan struct{}), release: make(chan struct{})}
	p := statestore.NewProjector(src, statestore.ProjectorOptions{})
	src.mu.Lock()
	src.armed = true
	src.mu.Unlock()
	read := func(ctx context.Context) chan error {
		c := make(chan error, 1)
		go func() {
			s, err := p.Project(ctx, "r")
			if err == nil && s.LastEventSeq != 1 {
				err = fmt.Errorf("watermark %d, want 1", s.LastEventSeq)
			}
			c <- err
		}()
		return c
	}
	inFlight := read(context.Background())
	select {
	case <-src.entered:
	case <-time.After(2 * time.Minute):
		t.Fatal("the first read never fetched")
	}
	// While that fetch is held: a read that will make the next fetch, with
	// a context that ends before it fetches, then a read that waits for it.
	ctx, cancel := context.WithCancel(context.Background())
	makesNext := read(ctx)
	time.Sleep(100 * time.Millisecond)
	waits := read(context.Background())
	time.Sleep(100 * time.Millisecond)
	cancel()
	close(src.release)
	if err := <-inFlight; err != nil {
		t.Fatal(err)
	}
	if err := <-makesNext; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled read: %v, want context.Canceled", err)
	}
	if err := <-waits; err != nil {
		t.Fatalf("a read with a live context failed with another call's: %v", err)
	}
}

// panickingFetcher is heldFetcher whose fetch after the held one panics.
type panickingFetcher struct{ heldFetcher }

func (f *panickingFetcher) Fetch(ctx context.Context, runID string, after int64, limit int) ([]statestore.RunEventRecord, error) {
	f.mu.Lock()
	held := f.armed
	f.mu.Unlock()
	if !held {
		panic("fetch panicked")
	}
	return f.heldFetcher.Fetch(ctx, runID, after, limit)
}

// A projection that panics does not leave the reads waiting for its fetch
// waiting for good: they get STORE_UNAVAILABLE.
func TestProjector_SharedFetchThatPanics(t *testing.T) {
	mem := memstore.New(statestore.ProjectorOptions{})
	appendAll(t, mem, storetest.Event("r", statestore.RunStarted, ""))
	src := &panickingFetcher{heldFetcher{inner: mem, armed: true, entered: make(chan struct{}), release: make(chan struct{})}}
	p := statestore.NewProjector(src, statestore.ProjectorOptions{})
	read := func() chan error {
		c := make(chan error, 1)
		go func() {
			defer func() {
				if v := recover(); v != nil {
					c <- fmt.Errorf("panicked: %v", v)
				}
			}()
			_, err := p.Project(context.Background(), "r")
			c <- err
		}()
		return c
	}
	inFlight := read()
	select {
	case <-src.entered:
	case <-time.After(2 * time.Minute):
		t.Fatal("the first read never fetched")
	}
	panics := read() // makes the next fetch, which panics
	time.Sleep(100 * time.Millisecond)
	waits := read()
	time.Sleep(100 * time.Millisecond)
	close(src.release)
	if err := <-inFlight; err != nil {
		t.Fatal(err)
	}
	if err := <-panics; err == nil {
		t.Fatal("the read whose fetch panicked did not panic")
	}
	select {
	case err := <-waits:
		if !errors.Is(err, statestore.ErrUnavailable) {
			t.Fatalf("the read waiting for a fetch that panicked: %v, want STORE_UNAVAILABLE", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the read waiting for a fetch that panicked still waits")
	}
}

// TestProjector_DefaultBoundKeepsFewerThanTheActiveRuns: without
// MaxRuns the projector keeps at most 2,000 runs' snapshots, well under
// the 10,000 active runs a bulk action takes, so that runs paused and
// left alone do not each hold a snapshot in memory; a run dropped early
// is rebuilt from the log with the snapshot it had.
func TestProjector_DefaultBoundKeepsFewerThanTheActiveRuns(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	p := statestore.NewProjector(mem, statestore.ProjectorOptions{})
	const runs = 2500
	var first *statestore.RunSnapshot
	for i := range runs {
		runID := fmt.Sprintf("run-%d", i)
		for _, w := range []*statestore.RunEventWrite{
			storetest.Event(runID, statestore.RunStarted, ""),
			storetest.Event(runID, statestore.StepStarted, "a"),
		} {
			if _, err := mem.Append(ctx, w); err != nil {
				t.Fatal(err)
			}
		}
		snap, err := p.Project(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = snap
		}
	}
	if n := p.CachedRuns(); n > 2000 {
		t.Fatalf("after %d runs the projector keeps %d snapshots, want at most 2000", runs, n)
	}
	got, err := p.Snapshot(ctx, "run-0")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, first) {
		t.Fatalf("run-0 rebuilt after eviction:\n got %+v\nwant %+v", got, first)
	}
}

// TestProjector_RunWithoutEventsIsNotKept: reading a run the log has no
// event of (a task of another deployment's workflow, a mistyped id)
// answers ErrNotFound and leaves nothing in the projector's memory, so
// such reads neither take the room of runs that exist nor show in
// sidecar_projector_cached_runs; a run that then appears is read in full.
func TestProjector_RunWithoutEventsIsNotKept(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New(statestore.ProjectorOptions{})
	p := statestore.NewProjector(mem, statestore.ProjectorOptions{})
	for i := range 50 {
		if _, err := p.Project(ctx, fmt.Sprintf("nobody-%d", i)); !errors.Is(err, statestore.ErrNotFound) {
			t.Fatalf("projection of a run without events: %v, want ErrNotFound", err)
		}
		if _, err := p.Snapshot(ctx, fmt.Sprintf("nobody-%d", i)); !errors.Is(err, statestore.ErrNotFound) {
			t.Fatalf("snapshot of a run without events: %v, want ErrNotFound", err)
		}
	}
	if n := p.CachedRuns(); n != 0 {
		t.Fatalf("after reading 50 runs without events the projector keeps %d runs, want 0", n)
	}
	if _, err := mem.Append(ctx, storetest.Event("nobody-0", statestore.RunStarted, "")); err != nil {
		t.Fatal(err)
	}
	snap, err := p.Snapshot(ctx, "nobody-0")
	if err != nil || snap.LastEventSeq != 1 {
		t.Fatalf("a run that appeared after a read found nothing: %+v, %v; want its RunStarted", snap, err)
	}
}

// stalledFetcher is a store that stopped answering: each fetch waits for
// the store's own bound (bound) and fails STORE_UNAVAILABLE with the
// deadline's error, as pgstore's and natsstore's calls do when their own
// timeout fires (the caller gave no deadline).
type stalledFetcher struct {
	bound   time.Duration
	fetches atomic.Int32
}

func (f *stalledFetcher) Fetch(ctx context.Context, runID string, after int64, limit int) ([]statestore.RunEventRecord, error) {
	f.fetches.Add(1)
	ctx, cancel := context.WithTimeout(ctx, f.bound)
	defer cancel()
	<-ctx.Done()
	return nil, &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: "fetch: timeout: " + ctx.Err().Error(), Err: ctx.Err()}
}

// Reads of one run that wait for a shared fetch get its failure when the
// store's own bound ended it: a stalled store costs each of them one bound,
// not one bound per read ahead of it. Before, a failure that wrapped the
// deadline's error was taken for the leading call's own context ending,
// every waiting read fetched again, and one read failed per bound while
// the others queued (200 reads of one run during a 50 s table lock on
// PostgreSQL answered after 45 s).
func TestProjector_SharedFetchFailedOnTheStoresBound(t *testing.T) {
	src := &stalledFetcher{bound: 50 * time.Millisecond}
	p := statestore.NewProjector(src, statestore.ProjectorOptions{})
	const reads = 20
	errs := make(chan error, reads)
	for range reads {
		go func() {
			_, err := p.Project(context.Background(), "r")
			errs <- err
		}()
	}
	for range reads {
		select {
		case err := <-errs:
			if !errors.Is(err, statestore.ErrUnavailable) {
				t.Fatalf("read: %v, want STORE_UNAVAILABLE", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("a read never ended")
		}
	}
	// The first read's fetch, and the one every read that arrived during
	// it shares.
	if n := src.fetches.Load(); n > 2 {
		t.Fatalf("%d fetches for %d concurrent reads of a stalled store, want at most 2: each waiting read took its own bound", n, reads)
	}
}
