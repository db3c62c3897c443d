package keep_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/taskworkers/keep"
)

// TestStore_KeepsReadsAndDrops: what is put is read back by another Store
// on the same bucket (another process), nothing kept reads as nil, and a
// dropped output is gone.
func TestStore_KeepsReadsAndDrops(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	a, err := keep.Open(ctx, js, keep.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Put(ctx, "run-1/1/step a", []byte(`{"orderId":"o-1"}`)); err != nil {
		t.Fatal(err)
	}
	b, err := keep.Open(ctx, js, keep.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(ctx, "run-1/1/step a")
	if err != nil || !bytes.Equal(got, []byte(`{"orderId":"o-1"}`)) {
		t.Fatalf("read back by another store: %q %v", got, err)
	}
	if got, err := b.Get(ctx, "run-1/2/step a"); got != nil || err != nil {
		t.Fatalf("nothing kept: %q %v, want nil, nil", got, err)
	}
	if err := b.Delete(ctx, "run-1/1/step a"); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Get(ctx, "run-1/1/step a"); got != nil || err != nil {
		t.Fatalf("dropped: %q %v, want nil, nil", got, err)
	}
	if err := a.Delete(ctx, "run-1/1/step a"); err != nil {
		t.Fatalf("dropping what is not kept: %v", err)
	}
}

// TestStore_Bounded: past MaxBytes a Put fails (the caller keeps the
// output in memory only) and what was kept stays readable.
func TestStore_Bounded(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	s, err := keep.Open(ctx, js, keep.Options{Bucket: "BOUNDED", MaxBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "first", random(t, 40<<10)); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "second", random(t, 40<<10)); err == nil {
		t.Fatal("a put past the bound succeeded")
	}
	if got, err := s.Get(ctx, "first"); err != nil || len(got) != 40<<10 {
		t.Fatalf("the first after the refused put: %d bytes, %v", len(got), err)
	}
}

// TestStore_LargerThanAMessage: an output larger than a NATS message
// (1 MiB by default) is kept in parts and read back whole.
func TestStore_LargerThanAMessage(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	s, err := keep.Open(ctx, js, keep.Options{})
	if err != nil {
		t.Fatal(err)
	}
	big := random(t, 3<<20)
	if err := s.Put(ctx, "big", big); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "big"); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read back: %d bytes, %v; want the %d put", len(got), err, len(big))
	}
}

func random(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
