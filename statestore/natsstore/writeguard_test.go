package natsstore

import (
	"testing"

	"go.uber.org/zap"
)

// BenchmarkWriteGuard measures the guard's question before each write
// (kept: what Check last found) against asking the server's health report
// instead (healthz: what a write would pay to ask it every time).
func BenchmarkWriteGuard(b *testing.B) {
	srv, err := StartEmbedded(EmbeddedConfig{DataDir: b.TempDir(), Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	if err := srv.Check(); err != nil {
		b.Fatal(err)
	}
	g := guardOf(nc, DefaultStream)
	if g.src == nil {
		b.Fatal("a connection of Embedded.Connect carries no guard")
	}
	b.Run("kept", func(b *testing.B) {
		for b.Loop() {
			if err := g.before(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("healthz", func(b *testing.B) {
		for b.Loop() {
			if r := srv.recheck(DefaultStream); r != nil {
				b.Fatal(r)
			}
		}
	})
}
