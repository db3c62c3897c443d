package registry_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/registry"
)

func isUUIDv4(s string) bool {
	u, err := uuid.Parse(s)
	return err == nil && len(s) == 36 && u.Version() == 4 && u.Variant() == uuid.RFC4122
}

func TestOpen(t *testing.T) {
	t.Run("Defaults", func(t *testing.T) {
		_, _, js, _ := newTestRegistry(t)
		st, err := js.Stream(ctx(t), "KV_"+registry.DefaultBucket)
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		cfg := st.CachedInfo().Config
		if cfg.Storage != jetstream.FileStorage || cfg.MaxMsgsPerSubject != 1 || cfg.MaxAge != 0 || cfg.Replicas != 1 {
			t.Fatalf("got storage=%v history=%d ttl=%s replicas=%d; want file, 1, 0s, 1",
				cfg.Storage, cfg.MaxMsgsPerSubject, cfg.MaxAge, cfg.Replicas)
		}
	})
	t.Run("BucketAndTTL", func(t *testing.T) {
		s := startServer(t, t.TempDir())
		_, js := connect(t, s)
		open(t, js, registry.Options{Bucket: "custom_ids", TTL: time.Hour})
		kv, err := js.KeyValue(ctx(t), "custom_ids")
		if err != nil {
			t.Fatalf("bind: %v", err)
		}
		st, err := kv.Status(ctx(t))
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		if st.TTL() != time.Hour || st.History() != 1 {
			t.Fatalf("got ttl=%s history=%d want 1h, 1", st.TTL(), st.History())
		}
		// Reopening with other options keeps the bucket as it is, entries
		// and settings: the sidecar's NATS user may not update a stream.
		r := open(t, js, registry.Options{Bucket: "custom_ids", TTL: 2 * time.Hour})
		id, _, err := r.EventID(ctx(t), "run", idemKey(1))
		if err != nil {
			t.Fatal(err)
		}
		r = open(t, js, registry.Options{Bucket: "custom_ids"})
		if got, err := r.Lookup(ctx(t), "run", idemKey(1)); err != nil || got != id {
			t.Fatalf("after reopen: got %q, %v want %q", got, err, id)
		}
		if st, _ := kv.Status(ctx(t)); st.TTL() != time.Hour {
			t.Fatalf("ttl after reopen with other options: got %s want the bucket's 1h", st.TTL())
		}
	})
	t.Run("PersistMode", func(t *testing.T) {
		s := startServer(t, t.TempDir())
		_, js := connect(t, s)
		mode := func(bucket string) jetstream.PersistModeType {
			t.Helper()
			st, err := js.Stream(ctx(t), "KV_"+bucket)
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			return st.CachedInfo().Config.PersistMode
		}
		open(t, js, registry.Options{Bucket: "fast"})
		if got := mode("fast"); got != jetstream.AsyncPersistMode {
			t.Fatalf("default bucket: persist mode %v want async", got)
		}
		open(t, js, registry.Options{Bucket: "synced", SyncWrites: true})
		if got := mode("synced"); got != jetstream.DefaultPersistMode {
			t.Fatalf("SyncWrites bucket: persist mode %v want default", got)
		}
		// The mode is fixed at creation: reopening with the other choice
		// keeps the bucket, its mode and its entries.
		r := open(t, js, registry.Options{Bucket: "fast", SyncWrites: true})
		id, _, err := r.EventID(ctx(t), "run", idemKey(1))
		if err != nil {
			t.Fatal(err)
		}
		if got := mode("fast"); got != jetstream.AsyncPersistMode {
			t.Fatalf("reopened with SyncWrites: persist mode %v want async kept", got)
		}
		if got, err := open(t, js, registry.Options{Bucket: "fast"}).Lookup(ctx(t), "run", idemKey(1)); err != nil || got != id {
			t.Fatalf("after reopen: got %q, %v want %q", got, err, id)
		}
	})
	t.Run("BucketOfTheKVAPI", func(t *testing.T) {
		// A bucket made by nats.go's KV API (an earlier sidecar, or
		// "nats kv add") opens as it is, in the default persist mode.
		s := startServer(t, t.TempDir())
		_, js := connect(t, s)
		kv, err := js.CreateKeyValue(ctx(t), jetstream.KeyValueConfig{Bucket: "older", History: 1, Storage: jetstream.FileStorage})
		if err != nil {
			t.Fatal(err)
		}
		key, _ := registry.Key("run", idemKey(2))
		const stored = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
		if _, err := kv.Create(ctx(t), key, []byte(stored)); err != nil {
			t.Fatal(err)
		}
		r := open(t, js, registry.Options{Bucket: "older"})
		if got, created, err := r.EventID(ctx(t), "run", idemKey(2)); err != nil || created || got != stored {
			t.Fatalf("got %q, created %v, %v want the stored %q", got, created, err, stored)
		}
		st, _ := js.Stream(ctx(t), "KV_older")
		if got := st.CachedInfo().Config.PersistMode; got != jetstream.DefaultPersistMode {
			t.Fatalf("persist mode %v want default kept", got)
		}
	})
	t.Run("BadOptions", func(t *testing.T) {
		s := startServer(t, t.TempDir())
		_, js := connect(t, s)
		for _, opts := range []registry.Options{
			{Bucket: "bad.name"},
			{Bucket: "bad name"},
			{Replicas: 6},
			{Replicas: -1},
			{TTL: -time.Second},
		} {
			if _, err := registry.Open(ctx(t), js, opts); err == nil {
				t.Errorf("Open(%+v): got nil error", opts)
			}
		}
	})
}

func TestRegistry_EventID(t *testing.T) {
	r, nc, js, _ := newTestRegistry(t)

	t.Run("CreatedThenFound", func(t *testing.T) {
		id, created, err := r.EventID(ctx(t), "run-1", idemKey(1))
		if err != nil || !created || !isUUIDv4(id) {
			t.Fatalf("first: got %q, %v, %v want a new UUID v4, true, nil", id, created, err)
		}
		for i := range 3 {
			again, created, err := r.EventID(ctx(t), "run-1", idemKey(1))
			if err != nil || created || again != id {
				t.Fatalf("retry %d: got %q, %v, %v want %q, false, nil", i, again, created, err, id)
			}
		}
	})
	t.Run("StoredValueIsUUIDv4", func(t *testing.T) {
		id, _, err := r.EventID(ctx(t), "run-2", idemKey(1))
		if err != nil {
			t.Fatal(err)
		}
		e := rawEntry(t, js, "run-2", idemKey(1))
		if got := string(e.Value()); got != id || !isUUIDv4(got) {
			t.Fatalf("stored %q, want UUID v4 %q", got, id)
		}
		if e.Revision() == 0 {
			t.Fatal("stored entry has revision 0")
		}
	})
	t.Run("DistinctKeys", func(t *testing.T) {
		seen := map[string]bool{}
		for _, in := range [][2]string{{"run-3", idemKey(1)}, {"run-3", idemKey(2)}, {"run-4", idemKey(1)}} {
			id, created, err := r.EventID(ctx(t), in[0], in[1])
			if err != nil || !created || seen[id] {
				t.Fatalf("%v: got %q, %v, %v want a new eventId", in, id, created, err)
			}
			seen[id] = true
		}
	})
	t.Run("ErrInvalidInput", func(t *testing.T) {
		for name, in := range map[string][2]string{
			"EmptyRunID":    {"", idemKey(1)},
			"RunID257Bytes": {strings.Repeat("x", 257), idemKey(1)},
			"RunID8KiB":     {strings.Repeat("x", 8<<10), idemKey(1)},
			"EmptyKey":      {"run", ""},
			"BadKey":        {"run", strings.ToUpper(idemKey(1))},
		} {
			if _, _, err := r.EventID(ctx(t), in[0], in[1]); !errors.Is(err, registry.ErrInvalidInput) {
				t.Errorf("%s: got %v want ErrInvalidInput", name, err)
			}
		}
		if nc.Status() != nats.CONNECTED {
			t.Fatalf("connection status %v after invalid input, want CONNECTED", nc.Status())
		}
		if _, _, err := r.EventID(ctx(t), "run-5", idemKey(1)); err != nil {
			t.Fatalf("EventID after invalid input: %v", err)
		}
	})
	t.Run("ErrCorrupt", func(t *testing.T) {
		kv, _ := js.KeyValue(ctx(t), registry.DefaultBucket)
		key, _ := registry.Key("run-6", idemKey(1))
		if _, err := kv.PutString(ctx(t), key, "not-a-uuid"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.EventID(ctx(t), "run-6", idemKey(1)); !errors.Is(err, registry.ErrCorrupt) {
			t.Fatalf("EventID: got %v want ErrCorrupt", err)
		}
		if _, err := r.Lookup(ctx(t), "run-6", idemKey(1)); !errors.Is(err, registry.ErrCorrupt) {
			t.Fatalf("Lookup: got %v want ErrCorrupt", err)
		}
		want := uuid.NewString()
		if err := r.Adopt(ctx(t), "run-6", idemKey(1), want); err != nil {
			t.Fatalf("Adopt over corrupt value: %v", err)
		}
		if got, _, err := r.EventID(ctx(t), "run-6", idemKey(1)); err != nil || got != want {
			t.Fatalf("after adopt: got %q, %v want %q", got, err, want)
		}
	})
	t.Run("RecreatedAfterDelete", func(t *testing.T) {
		id, _, _ := r.EventID(ctx(t), "run-7", idemKey(1))
		kv, _ := js.KeyValue(ctx(t), registry.DefaultBucket)
		key, _ := registry.Key("run-7", idemKey(1))
		if err := kv.Delete(ctx(t), key); err != nil {
			t.Fatal(err)
		}
		again, created, err := r.EventID(ctx(t), "run-7", idemKey(1))
		if err != nil || !created || again == id || !isUUIDv4(again) {
			t.Fatalf("after delete: got %q, %v, %v want a new eventId, true, nil", again, created, err)
		}
	})
	t.Run("ErrUnavailable", func(t *testing.T) {
		s := startServer(t, t.TempDir())
		nc2, js2 := connect(t, s)
		r2 := open(t, js2, registry.Options{})
		nc2.Close()
		if _, _, err := r2.EventID(ctx(t), "run", idemKey(1)); !errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("closed connection: got %v want ErrUnavailable", err)
		}
	})
}

// TestRegistry_EventID_Race runs n producers, each on its own connection and
// Registry (all opening the bucket at the same time), that request eventIds
// for the same keys concurrently. Each key must end with exactly one created
// eventId that every producer returned.
func TestRegistry_EventID_Race(t *testing.T) {
	for _, n := range []int{2, 32} {
		t.Run(fmt.Sprintf("Producers%d", n), func(t *testing.T) {
			s := startServer(t, t.TempDir())
			const keys = 20
			type result struct {
				id      string
				created bool
			}
			results := make([][keys]result, n)
			regs := make([]*registry.Registry, n)
			var wg sync.WaitGroup
			errs := make(chan error, n*(keys+1))
			for p := range n {
				_, js := connect(t, s)
				wg.Go(func() {
					r, err := registry.Open(ctx(t), js, registry.Options{Logger: zaptest.NewLogger(t)})
					if err != nil {
						errs <- fmt.Errorf("producer %d: open: %w", p, err)
						return
					}
					regs[p] = r
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			errs = make(chan error, n*keys)
			start := make(chan struct{})
			for p := range n {
				wg.Go(func() {
					<-start
					for k := range keys {
						id, created, err := regs[p].EventID(ctx(t), "race.run *>", idemKey(k))
						if err != nil {
							errs <- fmt.Errorf("producer %d key %d: %w", p, k, err)
						}
						results[p][k] = result{id, created}
					}
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for k := range keys {
				want := results[0][k].id
				creators := 0
				for p := range n {
					if results[p][k].id != want {
						t.Fatalf("key %d: producer %d got %q, producer 0 got %q", k, p, results[p][k].id, want)
					}
					if results[p][k].created {
						creators++
					}
				}
				if creators != 1 {
					t.Fatalf("key %d: %d producers report created, want 1", k, creators)
				}
				if got, err := regs[n-1].Lookup(ctx(t), "race.run *>", idemKey(k)); err != nil || got != want || !isUUIDv4(got) {
					t.Fatalf("key %d: stored %q, %v want %q", k, got, err, want)
				}
			}
		})
	}
}

func TestRegistry_Adopt(t *testing.T) {
	r, _, js, _ := newTestRegistry(t)

	t.Run("Updates", func(t *testing.T) {
		id, _, _ := r.EventID(ctx(t), "run-1", idemKey(1))
		want := uuid.NewString()
		if err := r.Adopt(ctx(t), "run-1", idemKey(1), want); err != nil {
			t.Fatalf("Adopt: %v", err)
		}
		got, created, err := r.EventID(ctx(t), "run-1", idemKey(1))
		if err != nil || created || got != want || got == id {
			t.Fatalf("EventID after Adopt: got %q, %v, %v want %q, false, nil", got, created, err, want)
		}
		if v := string(rawEntry(t, js, "run-1", idemKey(1)).Value()); v != want {
			t.Fatalf("stored %q want %q", v, want)
		}
	})
	t.Run("Idempotent", func(t *testing.T) {
		want := uuid.NewString()
		if err := r.Adopt(ctx(t), "run-2", idemKey(1), want); err != nil {
			t.Fatal(err)
		}
		rev := rawEntry(t, js, "run-2", idemKey(1)).Revision()
		for range 3 {
			if err := r.Adopt(ctx(t), "run-2", idemKey(1), want); err != nil {
				t.Fatalf("repeat Adopt: %v", err)
			}
		}
		if got := rawEntry(t, js, "run-2", idemKey(1)).Revision(); got != rev {
			t.Fatalf("revision after repeated Adopt: got %d want %d (no write)", got, rev)
		}
	})
	t.Run("MissingEntry", func(t *testing.T) {
		want := uuid.NewString()
		if err := r.Adopt(ctx(t), "run-3", idemKey(1), want); err != nil {
			t.Fatalf("Adopt: %v", err)
		}
		if got, err := r.Lookup(ctx(t), "run-3", idemKey(1)); err != nil || got != want {
			t.Fatalf("Lookup: got %q, %v want %q", got, err, want)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		if _, _, err := r.EventID(ctx(t), "run-4", idemKey(1)); err != nil {
			t.Fatal(err)
		}
		want := uuid.NewString()
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Go(func() { errs <- r.Adopt(ctx(t), "run-4", idemKey(1), want) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("concurrent Adopt: %v", err)
			}
		}
		if got, err := r.Lookup(ctx(t), "run-4", idemKey(1)); err != nil || got != want {
			t.Fatalf("Lookup: got %q, %v want %q", got, err, want)
		}
	})
	t.Run("ErrInvalidInput", func(t *testing.T) {
		v1 := "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
		for _, id := range []string{"", "not-a-uuid", v1, "{" + uuid.NewString() + "}", "urn:uuid:" + uuid.NewString()} {
			if err := r.Adopt(ctx(t), "run-5", idemKey(1), id); !errors.Is(err, registry.ErrInvalidInput) {
				t.Errorf("Adopt(%q): got %v want ErrInvalidInput", id, err)
			}
		}
		if err := r.Adopt(ctx(t), "", idemKey(1), uuid.NewString()); !errors.Is(err, registry.ErrInvalidInput) {
			t.Errorf("empty runId: got %v want ErrInvalidInput", err)
		}
		if _, err := r.Lookup(ctx(t), "run-5", idemKey(1)); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("invalid Adopt wrote something: Lookup got %v want ErrNotFound", err)
		}
	})
}

func TestRegistry_Lookup(t *testing.T) {
	r, _, _, _ := newTestRegistry(t)
	t.Run("ErrNotFound", func(t *testing.T) {
		if _, err := r.Lookup(ctx(t), "run", idemKey(1)); !errors.Is(err, registry.ErrNotFound) {
			t.Fatalf("got %v want ErrNotFound", err)
		}
	})
	t.Run("OK", func(t *testing.T) {
		id, _, _ := r.EventID(ctx(t), "run", idemKey(1))
		if got, err := r.Lookup(ctx(t), "run", idemKey(1)); err != nil || got != id {
			t.Fatalf("got %q, %v want %q", got, err, id)
		}
	})
}

// TestRegistry_Restart checks that entries, including adopted ones, survive
// a restart of the server on the same store directory.
func TestRegistry_Restart(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, dir)
	nc, js := connect(t, s)
	r := open(t, js, registry.Options{})

	want := map[string]string{}
	for name, runID := range oddRunIDs {
		id, _, err := r.EventID(ctx(t), runID, idemKey(1))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want[runID] = id
	}
	adopted := uuid.NewString()
	if err := r.Adopt(ctx(t), "run.1", idemKey(1), adopted); err != nil {
		t.Fatal(err)
	}
	want["run.1"] = adopted

	nc.Close()
	s.Shutdown()
	s.WaitForShutdown()

	s = startServer(t, dir)
	_, js = connect(t, s)
	r = open(t, js, registry.Options{})
	for runID, id := range want {
		got, created, err := r.EventID(ctx(t), runID, idemKey(1))
		if err != nil || created || got != id {
			t.Errorf("runId %q after restart: got %q, created=%v, %v want %q", runID, got, created, err, id)
		}
	}
}

// TestRegistry_RunIDs checks unusual runIds end to end, and that an over-long
// runId is refused without harming the connection.
func TestRegistry_RunIDs(t *testing.T) {
	r, nc, _, _ := newTestRegistry(t)
	for name, runID := range oddRunIDs {
		t.Run(name, func(t *testing.T) {
			id, created, err := r.EventID(ctx(t), runID, idemKey(1))
			if err != nil || !created {
				t.Fatalf("EventID: got %q, %v, %v want a new eventId", id, created, err)
			}
			if got, err := r.Lookup(ctx(t), runID, idemKey(1)); err != nil || got != id {
				t.Fatalf("Lookup: got %q, %v want %q", got, err, id)
			}
			want := uuid.NewString()
			if err := r.Adopt(ctx(t), runID, idemKey(1), want); err != nil {
				t.Fatalf("Adopt: %v", err)
			}
			if got, _, err := r.EventID(ctx(t), runID, idemKey(1)); err != nil || got != want {
				t.Fatalf("EventID after Adopt: got %q, %v want %q", got, err, want)
			}
		})
	}
	t.Run("RunID257BytesRefused", func(t *testing.T) {
		for _, runID := range []string{strings.Repeat("r", 257), strings.Repeat("é", 128) + "x", strings.Repeat("r", 5000)} {
			if _, _, err := r.EventID(ctx(t), runID, idemKey(1)); !errors.Is(err, registry.ErrInvalidInput) {
				t.Fatalf("%d-byte runId: got %v want ErrInvalidInput", len(runID), err)
			}
			if err := r.Adopt(ctx(t), runID, idemKey(1), uuid.NewString()); !errors.Is(err, registry.ErrInvalidInput) {
				t.Fatalf("%d-byte runId Adopt: got %v want ErrInvalidInput", len(runID), err)
			}
		}
		if err := nc.FlushTimeout(5 * time.Second); err != nil || nc.Status() != nats.CONNECTED {
			t.Fatalf("connection after refusal: flush %v, status %v", err, nc.Status())
		}
		if _, _, err := r.EventID(ctx(t), strings.Repeat("r", 256), idemKey(2)); err != nil {
			t.Fatalf("EventID after refusal: %v", err)
		}
	})
}

func TestMetrics(t *testing.T) {
	s := startServer(t, t.TempDir())
	_, js := connect(t, s)
	reg := prometheus.NewRegistry()
	r := open(t, js, registry.Options{Metrics: registry.NewMetrics(reg)})

	r.EventID(ctx(t), "run", idemKey(1))                 // created
	r.EventID(ctx(t), "run", idemKey(1))                 // found
	r.EventID(ctx(t), "", idemKey(1))                    // error
	r.Adopt(ctx(t), "run", idemKey(1), uuid.NewString()) // adopted
	id, _ := r.Lookup(ctx(t), "run", idemKey(1))         // found
	r.Adopt(ctx(t), "run", idemKey(1), id)               // unchanged
	r.Lookup(ctx(t), "run", idemKey(2))                  // not_found

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sidecar_registry_operations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[labels(m)] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"get_or_create/created": 1, "get_or_create/found": 1, "get_or_create/error": 1,
		"adopt/adopted": 1, "adopt/unchanged": 1, "adopt/error": 0,
		"lookup/found": 1, "lookup/not_found": 1, "lookup/error": 0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("operations_total{%s}: got %v want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got series %v, want exactly %v", got, want)
	}
}

func labels(m *dto.Metric) string {
	var op, result string
	for _, l := range m.GetLabel() {
		switch l.GetName() {
		case "op":
			op = l.GetValue()
		case "result":
			result = l.GetValue()
		default:
			return "unexpected label " + l.GetName()
		}
	}
	return op + "/" + result
}
