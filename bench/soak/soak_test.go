package soak

import (
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestSteady_JudgesBytesOnDiskNotLiveBytes: the verdict is over bytes on
// disk and RSS; the series that explain them (live bytes, a stream's
// directory, the Go heap) are shown beside them and never make a soak
// flat or not.
func TestSteady_JudgesBytesOnDiskNotLiveBytes(t *testing.T) {
	at := func(s int, disk, live, heap int64) Sample {
		return Sample{Elapsed: time.Duration(s) * time.Second, DiskBytes: disk, LiveBytes: live, HeapInuse: heap, RSS: 100 << 20,
			Messages: map[string]int64{"SIDECAR_EVENTS": 1000}, StreamDisk: map[string]int64{"SIDECAR_EVENTS": disk}}
	}
	// Live bytes flat, bytes on disk doubling: not flat.
	samples := []Sample{at(0, 1e6, 1e6, 1e6), at(10, 20e6, 10e6, 30e6), at(20, 40e6, 10e6, 10e6), at(30, 20e6, 10e6, 30e6)}
	got := map[string]Series{}
	for _, s := range steady(samples, 10*time.Second, 30*time.Second) {
		got[s.Name] = s
	}
	for _, tc := range []struct {
		name          string
		judged, flat  bool
		min, max, avg float64
	}{
		{"disk_bytes", true, false, 20e6, 40e6, 80e6 / 3},
		{"live_bytes", false, true, 10e6, 10e6, 10e6},
		{"disk_SIDECAR_EVENTS", false, false, 20e6, 40e6, 80e6 / 3},
		{"heap_inuse_bytes", false, false, 10e6, 30e6, 70e6 / 3},
		{"rss_bytes", true, true, 100 << 20, 100 << 20, 100 << 20},
		{"msgs_SIDECAR_EVENTS", true, true, 1000, 1000, 1000},
	} {
		s, ok := got[tc.name]
		if !ok {
			t.Fatalf("no series %s in %v", tc.name, got)
		}
		if s.Judged != tc.judged || s.Flat != tc.flat || s.Min != tc.min || s.Max != tc.max || s.Mean < tc.avg*0.999 || s.Mean > tc.avg*1.001 {
			t.Errorf("%s: got %+v, want judged %v flat %v min %.0f max %.0f mean %.0f", tc.name, s, tc.judged, tc.flat, tc.min, tc.max, tc.avg)
		}
	}
	r := &Result{Steady: steady(samples, 10*time.Second, 30*time.Second)}
	if r.Flat() {
		t.Fatal("Flat with bytes on disk doubling: got true, want false")
	}
	samples[2].DiskBytes, samples[2].LiveBytes = 20e6, 40e6
	if r := (&Result{Steady: steady(samples, 10*time.Second, 30*time.Second)}); !r.Flat() {
		t.Fatalf("Flat with bytes on disk flat and live bytes moving: got false, want true (%+v)", r.Steady)
	}
}

// TestSoak_ConductorHoldsKeepsUpWithTheRate: the count of workflows
// Conductor still holds must follow removal at the soak's rate; a sampler
// that looks up fewer runs a sample than are submitted counts a Conductor
// that keeps up as growing. At 10 runs/s sampled every 10 s, each sample
// adds 100 runs whose workflows are already gone (ids Conductor never
// had, answered 404 like a removed workflow); after 6 samples the count
// must not have grown past one sample's runs.
func TestSoak_ConductorHoldsKeepsUpWithTheRate(t *testing.T) {
	url := os.Getenv("SIDECAR_TEST_CONDUCTOR_URL")
	if url == "" {
		t.Skip("set SIDECAR_TEST_CONDUCTOR_URL (e.g. http://127.0.0.1:8080/api) to look workflows up in a real Conductor")
	}
	s := &soak{cfg: Config{Rate: 10, Sample: 10 * time.Second}, conductor: url, http: &http.Client{Timeout: time.Minute}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var held []int64
	for range 6 {
		s.mu.Lock()
		for range 100 {
			s.runs = append(s.runs, Run{RunID: uuid.NewString(), WorkflowID: uuid.NewString()})
		}
		s.mu.Unlock()
		held = append(held, s.conductorHolds(ctx))
	}
	if last := held[len(held)-1]; last > 100 {
		t.Fatalf("Conductor holds %d of 600 runs whose workflows are gone after 6 samples (per sample %v); want at most 100", last, held)
	}
}

// TestSteady_AMetricServeLeftOutIsUnknownNotZero: serve's log-size
// collector leaves its metric out of a scrape that takes over 2 s; the
// sample must not read that as an empty log (a steady log of ~8,000
// records judged not flat on one scrape, min 0).
func TestSteady_AMetricServeLeftOutIsUnknownNotZero(t *testing.T) {
	scrape := func(records float64) map[string]float64 {
		m := map[string]float64{"sidecar_log_bytes": records * 700, "go_memstats_heap_inuse_bytes": 30e6, "sidecar_runs_active": 5}
		for _, c := range runtimeColumns {
			m[c.metric] = 1
		}
		if records > 0 {
			m["sidecar_log_records"] = records
		}
		return m
	}
	var samples []Sample
	for i, records := range []float64{8000, 8100, 0, 7900, 8050} {
		sm := Sample{Elapsed: time.Duration(i) * 10 * time.Second, Messages: map[string]int64{}}
		applyMetrics(&sm, scrape(records))
		samples = append(samples, sm)
	}
	got := map[string]Series{}
	for _, s := range steady(samples, 0, time.Minute) {
		got[s.Name] = s
	}
	if s := got["log_records"]; !s.Flat || s.Min != 7900 || s.Max != 8100 {
		t.Fatalf("log_records: got %+v, want flat over 7900 - 8100 (the scrape without it left out)", s)
	}
	if m := samples[2].Missing; len(m) != 1 || m[0] != "log_records" {
		t.Fatalf("missing columns of the scrape without the log's records: got %v, want [log_records]", m)
	}
	none := []Sample{samples[2]}
	for _, s := range steady(none, 0, time.Minute) {
		if s.Name == "log_records" && s.Flat {
			t.Fatalf("log_records with no sample knowing it: got %+v, want not flat", s)
		}
	}
}

// TestSample_RecordsTheGoRuntime: each sample records serve's Go runtime
// metrics (the heap's objects, its idle and released bytes, stacks,
// collections, goroutines) as CSV columns beside RSS; the count of
// collections only grows, so it is no steady series; a metric the scrape
// lacked is unknown, not 0.
func TestSample_RecordsTheGoRuntime(t *testing.T) {
	scrape := map[string]float64{"go_memstats_heap_inuse_bytes": 30e6, "go_memstats_heap_alloc_bytes": 25e6,
		"go_memstats_heap_objects": 123456, "go_memstats_heap_idle_bytes": 9e6, "go_memstats_heap_released_bytes": 4e6,
		"go_memstats_next_gc_bytes": 50e6, "go_memstats_stack_inuse_bytes": 2e6, "go_gc_duration_seconds_count": 77}
	sm := Sample{Messages: map[string]int64{}}
	applyMetrics(&sm, scrape)
	header := headerOf(sm)
	row := rowOf(sm, header)
	col := map[string]string{}
	for i, h := range header {
		col[h] = row[i]
	}
	for name, want := range map[string]string{"heap_objects": "123456", "heap_idle_bytes": "9000000", "heap_released_bytes": "4000000",
		"next_gc_bytes": "50000000", "stack_inuse_bytes": "2000000", "gc_count": "77", "heap_alloc_bytes": "25000000", "goroutines": "NaN"} {
		if col[name] != want {
			t.Errorf("column %s: got %q, want %q (header %v)", name, col[name], want, header)
		}
	}
	for _, s := range steady([]Sample{sm}, 0, time.Minute) {
		if s.Name == "gc_count" {
			t.Errorf("gc_count is a steady series (%+v); it counts since serve started", s)
		}
	}
}

// TestHeapProfile_SavedIntoTheSoaksDir: with -heap-profile the soak saves
// serve's heap profile, read from a net/http/pprof listener as serve's
// --pprof-listen serves it, as Dir/heap-<seconds>.pb.gz: a gzipped
// profile that go tool pprof reads.
func TestHeapProfile_SavedIntoTheSoaksDir(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	dir := t.TempDir()
	s := &soak{cfg: Config{Dir: dir, Log: io.Discard}, http: &http.Client{Timeout: time.Minute}, pprofURL: "http://" + ln.Addr().String()}
	s.heapProfile(context.Background(), 301500*time.Millisecond)
	f, err := os.Open(filepath.Join(dir, "heap-00301.pb.gz"))
	if err != nil {
		t.Fatalf("no profile saved: %v", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("heap-00301.pb.gz is not gzipped: %v", err)
	}
	b, err := io.ReadAll(zr)
	if err != nil || len(b) == 0 {
		t.Fatalf("heap-00301.pb.gz: %d bytes, %v", len(b), err)
	}
}
