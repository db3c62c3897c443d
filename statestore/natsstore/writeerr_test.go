package natsstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// envWriteErrChild makes the test binary the child of
// TestEmbedded_WriteErrorIsNotReady, with the data dir as its value.
const envWriteErrChild = "NATSSTORE_WRITE_ERROR_CHILD_DIR"

// TestEmbedded_WriteErrorIsNotReady re-executes the test binary as a
// child whose files may not grow past natstest.WriteErrLimit: its
// embedded server's file store fails a write for real, and keeps that
// error until it restarts. The child checks that Check then refuses
// readiness and says which stream, why, and what to do.
func TestEmbedded_WriteErrorIsNotReady(t *testing.T) {
	natstest.RunWriteErrChild(t, "TestEmbedded_WriteErrorChild", envWriteErrChild, "Check: ")
}

// TestEmbedded_WriteErrorChild is the child of
// TestEmbedded_WriteErrorIsNotReady.
func TestEmbedded_WriteErrorChild(t *testing.T) {
	js, srv, logs := natstest.StartWriteErrChild(t, envWriteErrChild)
	if err := srv.Check(); err != nil {
		t.Fatalf("a fresh server is not ready: %v", err)
	}
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "SIDECAR_RUNS"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server: %s", natstest.FillUntilWriteError(t, kv, logs))
	err = srv.Check()
	if err == nil {
		t.Fatal("Check = nil with a stream that refuses every write, want not ready")
	}
	t.Logf("Check: %v", err)
	for _, want := range []string{"KV_SIDECAR_RUNS", "file too large", "restart"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Check = %q, want it to name %q", err, want)
		}
	}
}
