package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

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

// open builds the sinks, in order.
func (b Bus) open(ctx context.Context, js jetstream.JetStream, replicas int) ([]eventbus.Sink, error) {
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
			sink, err := eventbus.NewWebhookSink(*s.Webhook)
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
func (b Bus) checkNotSelf(ctx context.Context, own []string) error {
	var deny []exec.Destination
	for _, a := range own {
		d, err := listenerAddr(a)
		if err != nil {
			return err
		}
		deny = append(deny, d)
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
			return fmt.Errorf("--bus-sink %s: url= %s: %w (it must resolve, to check that it is not the sidecar itself)", name, hostPort, err)
		}
	}
	return nil
}
