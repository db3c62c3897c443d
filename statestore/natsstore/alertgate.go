package natsstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore"
)

var _ statestore.AlertGate = (*AlertGate)(nil)

// DefaultAlertBucket is the KV bucket of OpenAlertGate.
const DefaultAlertBucket = "SIDECAR_ALERTS"

// AlertGateOptions configures OpenAlertGate. The zero value uses the defaults.
type AlertGateOptions struct {
	// Bucket is the KV bucket name (default DefaultAlertBucket).
	Bucket string
	// Replicas is the bucket's replica count (default 1).
	Replicas int
	// TTL forgets claims after this long (default 0: never). An alert
	// whose claim expired can be raised again by a later resync.
	TTL time.Duration
}

// AlertGate is a statestore.AlertGate on a JetStream KV bucket: the first
// process to create the key <runToken>.<eventId> raises the alert; every
// other process, and this one after a restart, sees the key and stays
// quiet. It is safe for concurrent use.
type AlertGate struct {
	kv jetstream.KeyValue
}

// OpenAlertGate creates or binds the alert bucket.
func OpenAlertGate(ctx context.Context, js jetstream.JetStream, opts AlertGateOptions) (*AlertGate, error) {
	if opts.Bucket == "" {
		opts.Bucket = DefaultAlertBucket
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	kv, err := OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: opts.Bucket, History: 1, TTL: opts.TTL, Storage: jetstream.FileStorage, Replicas: opts.Replicas,
		Description: "sidecar: INVALID_TRANSITION alerts already raised, by run and eventId",
	})
	if err != nil {
		return nil, fmt.Errorf("open alert bucket %s: %w", opts.Bucket, err)
	}
	return &AlertGate{kv: kv}, nil
}

// First implements statestore.AlertGate with an atomic KV Create.
func (g *AlertGate) First(ctx context.Context, runID, eventID string) (bool, error) {
	_, err := g.kv.Create(ctx, alertKey(runID, eventID), nil)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	default:
		return false, unavailable("alert gate", err)
	}
}

// alertKey is <runToken>.<eventId>; an eventId that is not a plain UUID
// (records are validated, so only forged ones) is hashed to stay a valid key.
func alertKey(runID, eventID string) string {
	ok := eventID != "" && len(eventID) <= 64
	for i := 0; ok && i < len(eventID); i++ {
		c := eventID[i]
		ok = c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
	}
	if !ok {
		sum := sha256.Sum256([]byte(eventID))
		eventID = "h" + hex.EncodeToString(sum[:])
	}
	return RunToken(runID) + "." + eventID
}

// Streams are the JetStream streams the gate keeps its state in: its
// bucket's.
func (g *AlertGate) Streams() []string { return []string{"KV_" + g.kv.Bucket()} }
