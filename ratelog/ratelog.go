// Package ratelog bounds log lines that would otherwise repeat for every
// task, run or request while a dependency is down: such a line is logged
// at most once a minute, saying how many were held back, and once more
// when things work again.
package ratelog

import (
	stdlog "log"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Every is how often a Limiter lets a line through.
const Every = time.Minute

// Limiter lets one line through per Every. The zero value is ready; it is
// safe for concurrent use.
type Limiter struct {
	mu       sync.Mutex
	last     time.Time
	held     int
	degraded bool
}

// Take reports whether a line may be logged at now, and how many were held
// back since the last one let through.
func (l *Limiter) Take(now time.Time) (ok bool, heldBack int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.degraded = true
	if !l.last.IsZero() && now.Sub(l.last) < Every {
		l.held++
		return false, 0
	}
	heldBack, l.last, l.held = l.held, now, 0
	return true, heldBack
}

// Warn logs msg as a warning if the Limiter lets it through, with the
// number of warnings held back since the last one (warningsHeldBack).
func (l *Limiter) Warn(log *zap.Logger, msg string, fields ...zap.Field) {
	ok, held := l.Take(time.Now())
	if !ok {
		return
	}
	if held > 0 {
		fields = append(fields, zap.Int("warningsHeldBack", held))
	}
	log.Warn(msg+" (logged at most once a minute)", fields...)
}

// Recovered logs msg once after warnings, when things work again, and
// lets the next warning through at once.
func (l *Limiter) Recovered(log *zap.Logger, msg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.degraded {
		l.degraded, l.held, l.last = false, 0, time.Time{}
		log.Info(msg)
	}
}

// NewStdLog returns a standard logger that writes to log as warnings, at
// most one line a minute (with the lines held back since the last): for a
// library's error log whose lines clients can cause at will, as the
// net/http server's TLS handshake errors.
func NewStdLog(log *zap.Logger) *stdlog.Logger {
	return stdlog.New(&stdWriter{log: log}, "", 0)
}

type stdWriter struct {
	log *zap.Logger
	lim Limiter
}

func (w *stdWriter) Write(p []byte) (int, error) {
	w.lim.Warn(w.log, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
