package admission_test

import (
	"context"
	"testing"
	"time"

	"github.com/conductor-sidecar/sidecar/admission"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestAdmission_AStalledWatch: the server keeps the decider's watch
// consumer of the queue but it delivers nothing (paused on the server
// here, as an overloaded server left one for good). A start submitted
// after that is still decided.
func TestAdmission_AStalledWatch(t *testing.T) {
	e := newEnv(t)
	c := e.open(admission.Options{Limits: admission.Limits{Global: 5}, Policy: admission.Queue, Wait: 2 * time.Minute})
	defer c.Close(context.Background())
	if d, err := e.submit(c, "t1", "s-1"); err != nil || d.Started == nil {
		t.Fatalf("first: %+v %v", d, err)
	}
	st, err := e.js.Stream(context.Background(), "KV_"+admission.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if paused := natstest.StallConsumers(t, st); paused != 1 {
		t.Fatalf("paused %d consumers, want the decider's one", paused)
	}
	d, err := e.submit(c, "t1", "s-2")
	if err != nil || d.Started == nil {
		t.Fatalf("a start submitted while the decider's watch was stalled: %+v %v, want it started", d, err)
	}
}
