package node

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// natsEvents logs what serve's NATS connection reports on its own
// (errors the server sends asynchronously, such as a refused publish;
// disconnects and reconnects) through serve's logger instead of nats.go's
// default lines on stderr, one line a minute per kind of error.
type natsEvents struct {
	log  *zap.Logger
	mu   sync.Mutex
	seen map[string]*natsRepeat
}

type natsRepeat struct {
	at      time.Time
	skipped int
}

func newNATSEvents(log *zap.Logger) *natsEvents {
	return &natsEvents{log: log.Named("nats.client"), seen: map[string]*natsRepeat{}}
}

// options are the connection options that report to e.
func (e *natsEvents) options() []nats.Option {
	return []nats.Option{
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { e.asyncError(err) }),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err == nil || nc.IsClosed() {
				return // closed on purpose (serve stopping), or for good (serve says so itself)
			}
			e.log.Warn("disconnected from NATS; reconnecting", zap.Error(err))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			e.log.Info("reconnected to NATS", zap.String("server", nc.ConnectedUrlRedacted()))
		}),
	}
}

func (e *natsEvents) asyncError(err error) {
	if err == nil {
		return
	}
	key := err.Error()
	e.mu.Lock()
	now := time.Now()
	r := e.seen[key]
	if r != nil && now.Sub(r.at) < time.Minute {
		r.skipped++
		e.mu.Unlock()
		return
	}
	skipped := 0
	if r != nil {
		skipped = r.skipped
	}
	if len(e.seen) > 1000 {
		clear(e.seen)
	}
	e.seen[key] = &natsRepeat{at: now}
	e.mu.Unlock()
	e.log.Warn("NATS reported an error on serve's connection (logged once a minute per kind)", zap.Error(err), zap.Int("skippedSinceLast", skipped))
}
