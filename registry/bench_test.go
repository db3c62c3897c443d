package registry_test

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore"
	"github.com/conductor-sidecar/sidecar/statestore/pgstore/pgtest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// BenchmarkRegistry_EventID measures get-or-create against an embedded
// server on one connection: "Create" registers a new key per iteration (one
// KV Create), "Found" asks for an existing key (a failed Create plus reads).
func BenchmarkRegistry_EventID(b *testing.B) {
	s := startServer(b, b.TempDir())
	_, js := connect(b, s)
	r := open(b, js, registry.Options{Logger: zap.NewNop()})
	c := ctx(b)

	i := 0 // keys stay unique however often the sub-benchmark runs
	b.Run("Create", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			i++
			if _, created, err := r.EventID(c, "bench.run", idemKey(i)); err != nil || !created {
				b.Fatalf("created=%v err=%v", created, err)
			}
		}
	})
	b.Run("Found", func(b *testing.B) {
		if _, _, err := r.EventID(c, "bench.found", idemKey(0)); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, created, err := r.EventID(c, "bench.found", idemKey(0)); err != nil || created {
				b.Fatalf("created=%v err=%v", created, err)
			}
		}
	})
}

// BenchmarkRegistry_CreateSynced measures a first registration (one KV
// Create) on a server that fsyncs every write ("sync_interval: always", the
// embedded server's default), in a bucket in the default async persist
// mode and in one opened with SyncWrites.
func BenchmarkRegistry_CreateSynced(b *testing.B) {
	_, js := connect(b, startServerSync(b, b.TempDir(), true))
	c := ctx(b)
	i := 0
	for _, sync := range []bool{false, true} {
		r := open(b, js, registry.Options{Bucket: fmt.Sprintf("bench_sync_%v", sync), SyncWrites: sync, Logger: zap.NewNop()})
		b.Run(fmt.Sprintf("SyncWrites=%v", sync), func(b *testing.B) {
			for b.Loop() {
				i++
				if _, created, err := r.EventID(c, "bench.run", idemKey(i)); err != nil || !created {
					b.Fatalf("created=%v err=%v", created, err)
				}
			}
		})
	}
}

// BenchmarkEmit measures the producer's whole path per event (register the
// eventId, then append) on the two backends serve can run on, in the same
// run: JetStream (the event stream fsynced on every write, the registry
// bucket in its default async persist mode, as serve runs them) and
// PostgreSQL (both in one database, synchronous_commit on), at
// concurrency 1 and 64 over 1,000 runs. The PostgreSQL half skips
// without a PostgreSQL (SIDECAR_TEST_POSTGRES=1, package pgtest).
func BenchmarkEmit(b *testing.B) {
	c := ctx(b)
	backends := []struct {
		name string
		open func(b *testing.B) *registry.Emitter
	}{
		{"jetstream", func(b *testing.B) *registry.Emitter {
			_, js := connect(b, startServerSync(b, b.TempDir(), true))
			store, err := natsstore.Open(c, js, natsstore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = store.Close() })
			return registry.NewEmitter(open(b, js, registry.Options{Logger: zap.NewNop()}), store)
		}},
		{"postgres", func(b *testing.B) *registry.Emitter {
			store, err := pgstore.Open(c, pgtest.URL(b), pgstore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(store.Close)
			r, err := registry.OpenPostgres(c, store.Pool(), registry.PostgresOptions{})
			if err != nil {
				b.Fatal(err)
			}
			return registry.NewEmitter(r, store)
		}},
	}
	for _, be := range backends {
		for _, conc := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/conc=%d", be.name, conc), func(b *testing.B) {
				e := be.open(b)
				tag := time.Now().UnixNano()
				storetest.Concurrently(b, conc, func(i int) error {
					w := storetest.Event(fmt.Sprintf("run-%d-%04d", tag, i%1000), statestore.StepStarted, fmt.Sprintf("step-%06d", i))
					w.EventID = ""
					if res, err := e.Emit(c, w); err != nil || !res.Persisted {
						return fmt.Errorf("emit %d: %+v %v", i, res, err)
					}
					return nil
				})
			})
		}
	}
}
