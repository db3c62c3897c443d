package registry_test

import (
	"fmt"
	"testing"

	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/registry"
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
