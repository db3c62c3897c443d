package registry_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/conductor-sidecar/sidecar/registry"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// envWriteRefusedChild makes the test binary the child of
// TestRegistry_WriteRefusedFailsFast, with the data dir as its value.
const envWriteRefusedChild = "REGISTRY_WRITE_REFUSED_CHILD_DIR"

// TestRegistry_WriteRefusedFailsFast: the registry's bucket is written on
// every event, so on a full disk it is among the first streams to fail.
// Once the embedded server reports its write error (Check, as /readyz
// asks), a new eventId is refused at once with STORE_WRITE_REFUSED, as
// the store's other buckets are, instead of waiting out its timeout.
func TestRegistry_WriteRefusedFailsFast(t *testing.T) {
	natstest.RunWriteErrChild(t, "TestRegistry_WriteRefusedChild", envWriteRefusedChild, "refused: ")
}

// TestRegistry_WriteRefusedChild is the child of
// TestRegistry_WriteRefusedFailsFast.
func TestRegistry_WriteRefusedChild(t *testing.T) {
	ctx := context.Background()
	js, srv, logs := natstest.StartWriteErrChild(t, envWriteRefusedChild)
	const bucket = "SIDECAR_EVENT_IDS"
	r, err := registry.Open(ctx, js, registry.Options{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server: %s", natstest.FillUntilWriteError(t, raw, logs))
	if err := srv.Check(); err == nil {
		t.Fatal("Check = nil with the registry's stream refusing every write")
	}
	_, _, err = r.EventID(ctx, "run-refused", strings.Repeat("ab", 32))
	t.Logf("eventId refused: %v", err)
	if !errors.Is(err, natsstore.ErrWriteRefused) || !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("eventId = %v, want STORE_WRITE_REFUSED, and REGISTRY_UNAVAILABLE", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("eventId = %v, want it refused before its timeout", err)
	}
	if !strings.Contains(err.Error(), "KV_"+bucket) {
		t.Errorf("eventId = %q, want it to name the stream KV_%s", err, bucket)
	}
}
