package natsstore_test

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// TestEmbedded_NoWarningAnOperatorCannotActOn: the embedded server's start
// logs no warning about plaintext passwords: its users are the sidecar's
// own, configured in memory, and an operator who set no password went
// looking for one.
func TestEmbedded_NoWarningAnOperatorCannotActOn(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	srv, err := natsstore.StartEmbedded(natsstore.EmbeddedConfig{DataDir: t.TempDir(), Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	if n := logs.FilterMessageSnippet("Plaintext passwords").Len(); n != 0 {
		t.Fatalf("%d plaintext password warnings at start: %v", n, logs.All())
	}
}
