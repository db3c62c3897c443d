package eventbus_test

import (
	"context"
	"errors"
	"testing"

	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// TestOpenNATSSink_PrefixOfTheSidecarsOwn: a prefix whose subjects or
// stream are the sidecar's own is refused, and the log's stream is left
// as it was. prefix=SIDECAR made the stream name SIDECAR_EVENTS, the event
// log's: the sink bound it, every publish to SIDECAR.events.… found no
// stream, and every event was dead-lettered.
func TestOpenNATSSink_PrefixOfTheSidecarsOwn(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, prefix := range []string{"sidecar", "SIDECAR", "Sidecar", "KV_SIDECAR", "kv-x", "obj.x", "$JS", "a b", "a..b", "a.*", "a.>", ".a", "a."} {
		_, err := eventbus.OpenNATSSink(ctx, f.js, eventbus.NATSSinkConfig{Name: "s", Prefix: prefix})
		if !errors.Is(err, eventbus.ErrSinkInvalid) {
			t.Errorf("prefix=%q: %v, want BUS_SINK_INVALID", prefix, err)
		}
		if err := eventbus.CheckPrefix(prefix); !errors.Is(err, eventbus.ErrSinkInvalid) {
			t.Errorf("CheckPrefix(%q): %v, want BUS_SINK_INVALID", prefix, err)
		}
	}
	log, err := f.js.Stream(ctx, natsstore.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	if subj := log.CachedInfo().Config.Subjects; len(subj) != 1 || subj[0] != natsstore.DefaultSubjectPrefix+".>" {
		t.Fatalf("the log's stream subjects are now %v", subj)
	}
	for _, prefix := range []string{"acme", "acme-raw", "ops.acme", "team_1"} {
		if err := eventbus.CheckPrefix(prefix); err != nil {
			t.Errorf("CheckPrefix(%q): %v, want nil", prefix, err)
		}
	}
}
