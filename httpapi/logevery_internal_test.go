package httpapi

import (
	"testing"
	"time"
)

// TestLogEvery: a line a minute, with the count of those held back.
func TestLogEvery(t *testing.T) {
	var l logEvery
	t0 := time.Unix(1000, 0)
	if ok, n := l.take(t0); !ok || n != 0 {
		t.Fatalf("first: %v %d", ok, n)
	}
	for i := 1; i <= 3; i++ {
		if ok, _ := l.take(t0.Add(time.Duration(i) * time.Second)); ok {
			t.Fatalf("second %d within the minute let through", i)
		}
	}
	if ok, n := l.take(t0.Add(time.Minute)); !ok || n != 3 {
		t.Fatalf("after the minute: %v %d, want a line with 3 held back", ok, n)
	}
}
