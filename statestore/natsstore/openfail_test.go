package natsstore_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestOpen_FailureLeavesNothingRunning: an Open that fails after the
// stream and the watermark were opened (here: the snapshot bucket may not
// be created) stops what it started. serve opens the store again after a
// failed start (the NATS cluster was not ready), so every failed Open
// would otherwise leave a watermark loop behind.
func TestOpen_FailureLeavesNothingRunning(t *testing.T) {
	perms := natsstore.Permissions(natsstore.DefaultSubjectPrefix)
	perms.Publish.Deny = append(perms.Publish.Deny, "$JS.API.STREAM.CREATE.KV_"+natsstore.DefaultSnapshotBucket)
	_, srv := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: perms})
	js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := natsstore.Open(ctx, js, natsstore.Options{Logger: zaptest.NewLogger(t), SnapshotBucket: natsstore.DefaultSnapshotBucket})
	if !errors.Is(err, statestore.ErrUnavailable) {
		t.Fatalf("Open with the snapshot bucket denied: %v, want STORE_UNAVAILABLE", err)
	}
	// The loop is started by Open and ends when stopped; give the
	// scheduler a moment to end one that was stopped.
	const loop = "natsstore.(*watermark).start.func1"
	deadline := time.Now().Add(time.Minute)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, loop) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a failed Open left its watermark loop running:\n%s", stacks[strings.Index(stacks, loop)-200:][:1200])
		}
		time.Sleep(50 * time.Millisecond)
	}
}
