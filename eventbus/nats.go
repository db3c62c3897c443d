package eventbus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/vocab"
)

// NATSSink publishes each event on its own subject,
// <prefix>.events.<tenantId>.<planId>.<type> (ids as Token renders them;
// a NoETL type such as step.started is two tokens), into a JetStream
// stream that captures <prefix>.events.> and that the sink creates if it
// is missing. An event counts as delivered when the stream acknowledged
// it; its id is the message's Nats-Msg-Id, so that a redelivery within
// the stream's duplicate window (2 minutes by default) is dropped by
// JetStream itself. Consumers on the same cluster read the stream with a
// consumer of their own, filtered as they like.
type NATSSink struct {
	name, vocabulary, prefix string
	js                       jetstream.JetStream
}

// NATSSinkConfig configures a NATSSink.
type NATSSinkConfig struct {
	// Name names the sink (its cursor, metrics and dead letters).
	Name string
	// Vocabulary is vocab.Sidecar (default), vocab.Core or vocab.NoETL.
	Vocabulary string
	// Prefix is the subjects' first tokens (required).
	Prefix string
	// Stream is the stream that captures the subjects (default:
	// StreamName).
	Stream string
	// MaxAge bounds how long the stream keeps events (default 7 days).
	MaxAge time.Duration
	// Replicas is the stream's replica count (default 1).
	Replicas int
}

// OpenNATSSink binds or creates the sink's stream.
func OpenNATSSink(ctx context.Context, js jetstream.JetStream, cfg NATSSinkConfig) (*NATSSink, error) {
	if err := CheckPrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.Vocabulary == "" {
		cfg.Vocabulary = vocab.Sidecar
	}
	if _, err := vocab.Views(cfg.Vocabulary, nil); err != nil {
		return nil, &Error{Code: CodeSinkInvalid, Message: fmt.Sprintf("sink %s: vocabulary %q", cfg.Name, cfg.Vocabulary), Err: err}
	}
	if cfg.Stream == "" {
		cfg.Stream = StreamName(cfg.Prefix)
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = 7 * 24 * time.Hour
	}
	cfg.Replicas = max(cfg.Replicas, 1)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{cfg.Prefix + ".events.>"},
		MaxAge: cfg.MaxAge, Replicas: cfg.Replicas, Storage: jetstream.FileStorage,
		Description: "the sidecar's run events, one subject per event (sink " + cfg.Name + ")"})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		_, err = natsstore.BindStream(ctx, js, cfg.Stream)
	}
	if err != nil {
		return nil, &Error{Code: CodeSinkInvalid, Message: fmt.Sprintf("sink %s: stream %s", cfg.Name, cfg.Stream), Err: err}
	}
	return &NATSSink{name: cfg.Name, vocabulary: cfg.Vocabulary, prefix: cfg.Prefix, js: js}, nil
}

// Name implements Sink.
func (s *NATSSink) Name() string { return s.name }

// Vocabulary implements Sink.
func (s *NATSSink) Vocabulary() string { return s.vocabulary }

// Subject is the subject of m.
func (s *NATSSink) Subject(m *Message) string {
	return s.prefix + ".events." + Token(m.TenantID) + "." + Token(m.PlanID) + "." + m.Type
}

// Deliver implements Sink: it publishes msgs without waiting between
// them, then waits for the acknowledgements, and counts the acknowledged
// prefix. A later message acknowledged after an earlier failed one is
// published again with the earlier (the same Nats-Msg-Id: dropped as a
// duplicate).
func (s *NATSSink) Deliver(ctx context.Context, msgs []Message) (int, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		msg := &nats.Msg{Subject: s.Subject(m), Data: m.Body, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, m.ID)
		msg.Header.Set("Sidecar-Run-Id", m.RunID)
		msg.Header.Set("Sidecar-Event-Type", m.Type)
		f, err := s.js.PublishMsgAsync(msg)
		if err != nil {
			break
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return i, failed("publish "+f.Msg().Subject, err)
		case <-ctx.Done():
			return i, failed("publish "+f.Msg().Subject, ctx.Err())
		}
	}
	if len(futures) < len(msgs) {
		return len(futures), failed("publish", errors.New("too many publishes without acknowledgement"))
	}
	return len(msgs), nil
}

// CheckPrefix reports why prefix cannot be a nats sink's (nil when it
// can): it must be dot-separated tokens of letters, digits, '_' and '-';
// its subjects (<prefix>.events.>) and its stream (StreamName) must not be
// the sidecar's own: prefix=SIDECAR would name the stream SIDECAR_EVENTS,
// the event log's, and a stream named KV_… or OBJ_… is what NATS keeps a
// key-value bucket or an object store in.
func CheckPrefix(prefix string) error {
	invalid := func(why string) error {
		return &Error{Code: CodeSinkInvalid, Message: fmt.Sprintf("nats sink prefix=%q: %s", prefix, why)}
	}
	if prefix == "" {
		return invalid("a nats sink needs prefix= (events go to <prefix>.events.<tenantId>.<planId>.<type>)")
	}
	for _, tok := range strings.Split(prefix, ".") {
		if tok == "" || strings.ContainsFunc(tok, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
		}) {
			return invalid("want dot-separated tokens of letters, digits, '_' and '-', e.g. acme or ops.acme")
		}
	}
	stream := StreamName(prefix)
	switch {
	case strings.EqualFold(prefix, "sidecar") || stream == natsstore.DefaultStream:
		return invalid("its subjects or its stream (" + stream + ") would be the event log's own; choose another prefix, e.g. prefix=acme")
	case strings.HasPrefix(stream, "KV_") || strings.HasPrefix(stream, "OBJ_"):
		return invalid("its stream " + stream + " would be taken for a NATS key-value bucket or object store; choose another prefix, e.g. prefix=acme")
	}
	return nil
}

// StreamName is the stream a nats sink of prefix keeps its events in
// unless NATSSinkConfig.Stream names one: the prefix upper-cased, '.'
// and '-' as '_', then "_EVENTS".
func StreamName(prefix string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r == '.' || r == '-':
			return '_'
		}
		return r
	}, prefix) + "_EVENTS"
}
