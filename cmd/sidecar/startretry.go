package main

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/conductor-sidecar/sidecar/node"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// The wait between two start attempts on a NATS cluster that is not
// ready: from startRetryFirst, doubled each time up to startRetryMax, each
// wait drawn within ±50% so that replicas started together spread out.
const (
	startRetryFirst = 250 * time.Millisecond
	startRetryMax   = 5 * time.Second
)

// startWithRetry starts the sidecar; with --nats-url it opens its node
// anew while the attempt failed because the NATS cluster is not ready yet
// (natsstore.NotReady), for at most --nats-start-timeout. The listeners are
// bound once; every component opened by a failed attempt is closed before
// the next one (node.Open does), and every open binds to what an earlier
// attempt or another replica created. Each retry logs one line. An error
// that is not transient, or the last one once the time is up, ends the
// start.
func startWithRetry(ctx context.Context, cfg Config, log *zap.Logger, own ...string) (*sidecar, error) {
	if cfg.NATSURL == "" || cfg.NATSStartTimeout <= 0 {
		// The embedded server is ready when it has started.
		return startSidecar(ctx, cfg, log, own...)
	}
	nodeCfg, err := cfg.node(log, own)
	if err != nil {
		return nil, err
	}
	sc, err := openWithRetry(ctx, &cfg, nodeCfg, log)
	if err != nil {
		closeListeners(nodeCfg)
	}
	return sc, err
}

func openWithRetry(ctx context.Context, cfg *Config, nodeCfg node.Config, log *zap.Logger) (*sidecar, error) {
	began := time.Now()
	quiet := log.WithOptions(zap.AddStacktrace(zapcore.FatalLevel))
	attempt, retries := 0, 0
	var last error
	sc, err := backoff.Retry(ctx, func() (*sidecar, error) {
		attempt++
		sc, err := openSidecar(ctx, cfg, nodeCfg, log)
		if err != nil {
			last = err
			if !natsstore.NotReady(err) {
				return nil, backoff.Permanent(err)
			}
		}
		return sc, err
	},
		backoff.WithBackOff(&backoff.ExponentialBackOff{InitialInterval: startRetryFirst, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: startRetryMax}),
		backoff.WithMaxElapsedTime(cfg.NATSStartTimeout),
		backoff.WithNotify(func(err error, next time.Duration) {
			retries++
			quiet.Warn("the NATS cluster is not ready; starting again", zap.Int("attempt", attempt),
				zap.Duration("in", next.Round(time.Millisecond)), zap.String("error", err.Error()))
		}))
	switch {
	case err == nil:
		if attempt > 1 {
			log.Info("started once the NATS cluster was ready", zap.Int("attempts", attempt), zap.Duration("waited", time.Since(began).Round(time.Millisecond)))
		}
		return sc, nil
	case ctx.Err() != nil && retries > 0:
		// A signal once serve was waiting: during a wait, or during a
		// later attempt (whose requests then fail with context.Canceled).
		return nil, fmt.Errorf("stopped while waiting for the NATS cluster to be ready: %w", last)
	case ctx.Err() != nil:
		// A signal during the first attempt (a request to a cluster that
		// does not answer yet, say).
		return nil, fmt.Errorf("stopped while starting: %w", err)
	case last == nil || !natsstore.NotReady(last):
		return nil, err
	default:
		return nil, fmt.Errorf("the NATS cluster was not ready within --nats-start-timeout %s (%d attempts): %w; check the cluster (nats server report jetstream) or raise --nats-start-timeout",
			cfg.NATSStartTimeout, attempt, last)
	}
}
