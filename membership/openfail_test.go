package membership_test

import (
	"context"
	"errors"
	"testing"

	"github.com/conductor-sidecar/sidecar/membership"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestOpen_FailureLeavesNoMember: an Open that wrote its heartbeat but
// could not watch the others (here: the watch's consumer may not be
// created) takes its key back. serve opens the members again after a
// failed start (the NATS cluster was not ready); a key left behind would
// count as a live replica, and own a share of the runs that nobody works
// on, until it is dead.
func TestOpen_FailureLeavesNoMember(t *testing.T) {
	perms := natsstore.Permissions(natsstore.DefaultSubjectPrefix)
	stream := "KV_" + membership.DefaultBucket
	perms.Publish.Deny = append(perms.Publish.Deny, "$JS.API.CONSUMER.CREATE."+stream, "$JS.API.CONSUMER.CREATE."+stream+".>")
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{Permissions: perms})
	ctx := context.Background()
	if _, err := membership.Open(ctx, js, membership.Options{Name: "replica-a"}); !errors.Is(err, membership.ErrUnavailable) {
		t.Fatalf("Open without the right to watch: %v, want ErrUnavailable", err)
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq == 0 {
		t.Fatal("no heartbeat was written: the test does not reach the watch")
	}
	last, err := st.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if op := last.Header.Get("KV-Operation"); op != "DEL" && op != "PURGE" {
		t.Fatalf("the last record of %s is %s (operation %q): the failed member's key is still live", stream, last.Subject, op)
	}
}
