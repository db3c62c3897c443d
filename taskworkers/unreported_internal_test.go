package taskworkers

import (
	"context"
	"testing"
)

// The outputs kept are bounded in bytes and in number, the oldest going
// first; one larger than the bound is not kept.
func TestUnreportedOutputs_Bounded(t *testing.T) {
	var u unreportedOutputs
	key := func(i int) stepAttempt { return stepAttempt{run: "r", step: "s", logical: int64(i)} }
	for i := range maxKept + 10 {
		u.keep(context.Background(), key(i), map[string]any{"i": i}, 10)
	}
	if len(u.m) != maxKept || u.bytes != 10*maxKept {
		t.Fatalf("%d kept, %d bytes; want %d and %d", len(u.m), u.bytes, maxKept, 10*maxKept)
	}
	if _, ok := u.take(context.Background(), key(0)); ok {
		t.Fatal("the oldest was kept past the bound")
	}
	if out, ok := u.take(context.Background(), key(maxKept+9)); !ok || out["i"] != maxKept+9 {
		t.Fatalf("the newest: %v %v", out, ok)
	}
	u.keep(context.Background(), key(-1), nil, maxUnreportedBytes+1)
	if _, ok := u.take(context.Background(), key(-1)); ok {
		t.Fatal("an output larger than the bound was kept")
	}
	u.keep(context.Background(), key(-2), nil, maxUnreportedBytes)
	if len(u.m) != 1 || u.bytes != maxUnreportedBytes {
		t.Fatalf("after one output of the whole bound: %d kept, %d bytes; want it alone", len(u.m), u.bytes)
	}
}
