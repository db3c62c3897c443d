package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/taskworkers/exec"
)

// natsSubjects are the subjects the NATS sinks publish to (the embedded
// server's permissions grant them).
func (b Bus) natsSubjects() []string {
	var out []string
	for _, s := range b.Sinks {
		if s.NATS != nil {
			out = append(out, s.NATS.Prefix+".events.>")
		}
	}
	return out
}

// open builds the sinks, in order; a webhook's connections are refused
// when they would reach one of own (checkNotSelf's rule, at every dial).
func (b Bus) open(ctx context.Context, js jetstream.JetStream, replicas int, own []string) ([]eventbus.Sink, error) {
	deny, err := denyOwn(own)
	if err != nil {
		return nil, err
	}
	var out []eventbus.Sink
	for _, s := range b.Sinks {
		switch {
		case s.NATS != nil:
			cfg := *s.NATS
			cfg.Replicas = replicas
			sink, err := eventbus.OpenNATSSink(ctx, js, cfg)
			if err != nil {
				return nil, err
			}
			out = append(out, sink)
		case s.Webhook != nil:
			cfg := *s.Webhook
			cfg.Client = &http.Client{Transport: exec.NewDenyingTransport(deny)}
			sink, err := eventbus.NewWebhookSink(cfg)
			if err != nil {
				return nil, err
			}
			out = append(out, sink)
		}
	}
	return out, nil
}

// checkNotSelf refuses a webhook sink whose URL reaches one of own, the
// sidecar's listeners (its API first): it would deliver the log to the
// sidecar itself. The message names the sink and its host:port only (a
// URL may carry a token in its query).
func (b Bus) checkNotSelf(ctx context.Context, own []string, log *zap.Logger) error {
	deny, err := denyOwn(own)
	if err != nil {
		return err
	}
	for _, s := range b.Sinks {
		if s.Webhook == nil {
			continue
		}
		name := s.Webhook.Name
		u, err := url.Parse(s.Webhook.URL)
		if err != nil || u.Hostname() == "" {
			return fmt.Errorf("--bus-sink %s: url= is not a URL with a host", name)
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("--bus-sink %s: url= has no valid port", name)
		}
		hostPort := net.JoinHostPort(u.Hostname(), port)
		if err := exec.CheckDenied(ctx, u.Hostname(), uint16(n), deny); err != nil {
			if errors.Is(err, exec.ErrDestinationForbidden) {
				return fmt.Errorf("--bus-sink %s: url= %s reaches the sidecar's own API (or its pprof or NATS listener), so it would deliver the log to itself; point url= at the consumer", name, hostPort)
			}
			// A consumer's name that does not resolve yet (its Service
			// not created, its DNS away) does not stop the sidecar: the
			// sink retries, and each of its connections is checked as
			// it is dialled (open).
			log.Warn("an event bus webhook's host does not resolve now; serving, the sink retries its deliveries (each connection is checked not to reach the sidecar itself)",
				zap.String("sink", name), zap.String("hostPort", hostPort), zap.Error(err))
		}
	}
	return nil
}

// denyOwn is the destinations of the sidecar's own listeners.
func denyOwn(own []string) ([]exec.Destination, error) {
	var deny []exec.Destination
	for _, a := range own {
		d, err := listenerAddr(a)
		if err != nil {
			return nil, err
		}
		deny = append(deny, d)
	}
	return deny, nil
}
