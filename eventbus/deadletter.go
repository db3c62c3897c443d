package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// DeadLetterBucket is the KV bucket of the dead letters: one key per
// event a sink did not take, <sink>.<log sequence, 20 digits>.<event id
// token>, kept until replayed. (A bucket, not a plain stream: removing a
// replayed one is a KV delete, which the sidecar's NATS user may do,
// while deleting a stream message is denied to it, docs/security.md.)
const DeadLetterBucket = "SIDECAR_EVENTBUS_DLQ"

// DeadLetter is an event a sink did not take after its attempts.
type DeadLetter struct {
	// Key names the dead letter (replay it by its key).
	Key         string    `json:"key"`
	Sink        string    `json:"sink"`
	Attempts    int       `json:"attempts"`
	Error       string    `json:"error"`
	DeadAt      time.Time `json:"deadAt"`
	EventID     string    `json:"eventId"`
	EventType   string    `json:"eventType"`
	RunID       string    `json:"runId"`
	TenantID    string    `json:"tenantId"`
	PlanID      string    `json:"planId"`
	LogSeq      uint64    `json:"logSeq"`
	PersistedAt string    `json:"persistedAt"`
	// Body is the event as the sink would have delivered it.
	Body json.RawMessage `json:"body"`
	// ReplayingSince is when a replay claimed the dead letter (zero:
	// none): another replay leaves it alone until the claim is stale.
	ReplayingSince time.Time `json:"replayingSince,omitzero"`
}

func (d *DeadLetter) message() Message {
	return Message{ID: d.EventID, Type: d.EventType, RunID: d.RunID, TenantID: d.TenantID, PlanID: d.PlanID,
		PersistedAt: d.PersistedAt, Seq: d.LogSeq, Body: d.Body}
}

// deadLetters is the dead-letter bucket.
type deadLetters struct {
	kv jetstream.KeyValue
}

func openDeadLetters(ctx context.Context, js jetstream.JetStream, replicas int) (*deadLetters, error) {
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: DeadLetterBucket, Replicas: max(replicas, 1), History: 1,
		Description: "events the sidecar's event bus could not deliver, kept until replayed (sidecar bus deadletters / replay)"})
	if err != nil {
		return nil, unavailable("bucket "+DeadLetterBucket, err)
	}
	return &deadLetters{kv: kv}, nil
}

func deadLetterKey(sink string, m *Message) string {
	return fmt.Sprintf("%s.%020d.%s", sink, m.Seq, Token(m.ID))
}

// add keeps m as a dead letter of sink (a repeat, after a crash between
// this and the cursor's write, writes the same key again).
func (d *deadLetters) add(ctx context.Context, sink string, m *Message, attempts int, cause error) error {
	dl := DeadLetter{Key: deadLetterKey(sink, m), Sink: sink, Attempts: attempts, Error: cause.Error(), DeadAt: time.Now().UTC(),
		EventID: m.ID, EventType: m.Type, RunID: m.RunID, TenantID: m.TenantID, PlanID: m.PlanID, LogSeq: m.Seq,
		PersistedAt: m.PersistedAt, Body: m.Body}
	if !json.Valid(dl.Body) {
		dl.Body, _ = json.Marshal(string(m.Body))
	}
	b, err := json.Marshal(dl)
	if err != nil {
		return unavailable("encode dead letter", err)
	}
	if _, err := d.kv.Put(ctx, dl.Key, b); err != nil {
		return unavailable("dead-letter "+m.ID, err)
	}
	return nil
}

// keys returns the keys of sink's dead letters ("": every sink's), in
// order: by sink, then by log sequence.
func (d *deadLetters) keys(ctx context.Context, sink string) ([]string, error) {
	filter := ">"
	if sink != "" {
		filter = sink + ".>"
	}
	lister, err := d.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, unavailable("list dead letters", err)
	}
	var out []string
	for k := range lister.Keys() {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}

// list returns up to limit dead letters of sink ("" every sink) whose
// keys sort after after and that keep accepts (nil: all).
func (d *deadLetters) list(ctx context.Context, sink, after string, limit int, keep func(*DeadLetter) bool) ([]DeadLetter, error) {
	keys, err := d.keys(ctx, sink)
	if err != nil {
		return nil, err
	}
	out := []DeadLetter{}
	for _, k := range keys {
		if k <= after {
			continue
		}
		if len(out) >= limit {
			break
		}
		dl, err := d.get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // replayed meanwhile
		}
		if err != nil {
			return out, err
		}
		if keep != nil && !keep(&dl) {
			continue
		}
		out = append(out, dl)
	}
	return out, nil
}

// get returns the dead letter at key.
func (d *deadLetters) get(ctx context.Context, key string) (DeadLetter, error) {
	dl, _, err := d.getRev(ctx, key)
	return dl, err
}

// getRev returns the dead letter at key and its revision.
func (d *deadLetters) getRev(ctx context.Context, key string) (DeadLetter, uint64, error) {
	e, err := d.kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
			return DeadLetter{}, 0, jetstream.ErrKeyNotFound
		}
		return DeadLetter{}, 0, unavailable("read dead letter", err)
	}
	var dl DeadLetter
	if err := json.Unmarshal(e.Value(), &dl); err != nil {
		return DeadLetter{}, 0, unavailable("dead letter "+key+" is damaged", err)
	}
	return dl, e.Revision(), nil
}

// errClaimed: another replay has the dead letter (or has replayed it).
var errClaimed = errors.New("eventbus: the dead letter is being replayed by another request")

// claim marks the dead letter read at rev as being replayed now, and
// returns its new revision; errClaimed when another replay changed it
// since, or holds a claim younger than stale.
func (d *deadLetters) claim(ctx context.Context, key string, dl DeadLetter, rev uint64, stale time.Duration) (uint64, error) {
	if !dl.ReplayingSince.IsZero() && time.Since(dl.ReplayingSince) < stale {
		return 0, errClaimed
	}
	dl.ReplayingSince = time.Now().UTC()
	b, err := json.Marshal(dl)
	if err != nil {
		return 0, err
	}
	next, err := d.kv.Update(ctx, key, b, rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err) {
			return 0, errClaimed
		}
		return 0, unavailable("claim dead letter", err)
	}
	return next, nil
}

// release drops a claim (the replay failed): the dead letter is kept for
// the next replay.
func (d *deadLetters) release(ctx context.Context, key string, dl DeadLetter, rev uint64) {
	dl.ReplayingSince = time.Time{}
	if b, err := json.Marshal(dl); err == nil {
		_, _ = d.kv.Update(ctx, key, b, rev)
	}
}

// isWrongSequence tells a write refused because the key changed since
// the revision it was conditioned on.
func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// remove deletes the dead letter at key (replayed).
func (d *deadLetters) remove(ctx context.Context, key string, rev uint64) error {
	if err := d.kv.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		if isWrongSequence(err) {
			return errClaimed
		}
		return unavailable("remove dead letter", err)
	}
	return nil
}

// count returns how many dead letters sink has.
func (d *deadLetters) count(ctx context.Context, sink string) (uint64, error) {
	keys, err := d.keys(ctx, sink)
	return uint64(len(keys)), err
}

// sinkOf is the sink a dead letter's key names.
func sinkOf(key string) string {
	s, _, _ := strings.Cut(key, ".")
	return s
}
