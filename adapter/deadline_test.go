package adapter

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestRuns_ListKeysDeadline: listing the run index (what drain.Open and
// the background loops do) on a server that never delivers the listing
// ends with an error instead of hanging (a restart once hung for over
// 2 minutes in drain.Open -> Runs.ActiveRunIDs -> listKeys). The
// server here answers API requests (replies on _INBOX.<mux>.<token>) but
// the user may not subscribe to a watcher's deliver subject (_INBOX.<id>),
// so the consumer is created and its messages never arrive.
func TestRuns_ListKeysDeadline(t *testing.T) {
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{">"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.*.*"}},
	}})
	env := newNATS(t)
	r, err := OpenRuns(context.Background(), js, newClient(t, "http://127.0.0.1:1/api", 100*time.Millisecond), env.emitter,
		RunsOptions{ListTimeout: time.Second, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.kv.Put(context.Background(), keyActive+"run-1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.ActiveRunIDs(context.Background())
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a listing that never arrived succeeded")
		}
		t.Logf("listing that never arrives: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("listing still hangs after 20s (ListTimeout 1s)")
	}
}
