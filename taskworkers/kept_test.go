package taskworkers

import (
	"fmt"
	"testing"
	"time"
)

// TestKeptOutcomes: an outcome is taken once, only for the retry count it
// was kept at and within keptFor; at most maxKept are held, the oldest
// dropped first.
func TestKeptOutcomes(t *testing.T) {
	var k keptOutcomes
	k.keep("t1", keptOutcome{retryCount: 2, engine: 3, at: time.Now()})
	if _, ok := k.take("t1", 1); ok {
		t.Fatal("taken at another retry count")
	}
	if _, ok := k.take("t1", 2); ok {
		t.Fatal("a mismatched take must drop it (Conductor moved on)")
	}
	k.keep("t1", keptOutcome{retryCount: 2, engine: 3, at: time.Now()})
	if o, ok := k.take("t1", 2); !ok || o.engine != 3 {
		t.Fatalf("take: %+v %v", o, ok)
	}
	if _, ok := k.take("t1", 2); ok {
		t.Fatal("taken twice")
	}
	k.keep("old", keptOutcome{at: time.Now().Add(-keptFor - time.Second)})
	if _, ok := k.take("old", 0); ok {
		t.Fatal("an outcome older than keptFor was taken")
	}
	base := time.Now()
	for i := range maxKept + 1 {
		k.keep(fmt.Sprintf("t%05d", i), keptOutcome{at: base.Add(time.Duration(i) * time.Millisecond)})
	}
	if len(k.m) != maxKept {
		t.Fatalf("%d kept, want at most %d", len(k.m), maxKept)
	}
	if _, ok := k.take("t00000", 0); ok {
		t.Fatal("the oldest was not the one dropped")
	}
	if _, ok := k.take(fmt.Sprintf("t%05d", maxKept), 0); !ok {
		t.Fatal("the newest was dropped")
	}
}
