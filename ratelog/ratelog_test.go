package ratelog_test

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/ratelog"
)

// TestLimiter: one warning a minute, the next one saying how many were
// held back; after Recovered (logged once), the next warning goes through
// at once.
func TestLimiter(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(core)
	var l ratelog.Limiter
	for range 5 {
		l.Warn(log, "store down")
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("5 warnings within a minute: %d lines, want 1", n)
	}
	l.Recovered(log, "store back")
	l.Recovered(log, "store back")
	l.Warn(log, "store down")
	all := logs.All()
	if len(all) != 3 || all[1].Message != "store back" || all[2].Level != zapcore.WarnLevel {
		t.Fatalf("lines %v; want the warning, one recovery, the next warning", all)
	}
	t0 := time.Now()
	var m ratelog.Limiter
	if ok, _ := m.Take(t0); !ok {
		t.Fatal("the first line was held back")
	}
	for range 3 {
		if ok, _ := m.Take(t0.Add(time.Second)); ok {
			t.Fatal("a line within the minute went through")
		}
	}
	if ok, held := m.Take(t0.Add(ratelog.Every)); !ok || held != 3 {
		t.Fatalf("a minute later: %v, %d held back; want through, 3", ok, held)
	}
}
