package ratelog_test

import (
	"strings"
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

// The net/http server's error log (a TLS handshake error a connection, a
// line a client can make at will) passes one line a minute, saying how
// many it held back.
func TestNewStdLog(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	l := ratelog.NewStdLog(zap.New(core))
	for i := range 10 {
		l.Printf("http: TLS handshake error from 127.0.0.1:%d: EOF", 40000+i)
	}
	all := logs.All()
	if len(all) != 1 || all[0].Level != zap.WarnLevel || !strings.HasPrefix(all[0].Message, "http: TLS handshake error from 127.0.0.1:40000: EOF") {
		t.Fatalf("logged %v, want the first line alone, as a warning", all)
	}
}
