package registry

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// DefaultBucket is the KV bucket name Open uses when Options.Bucket is empty.
const DefaultBucket = "SIDECAR_EVENT_IDS"

// casAttempts bounds the read/compare-and-set rounds of one EventID or
// Adopt call before it gives up with ErrConflict.
const casAttempts = 5

// Options configures Open. The zero value works: bucket DefaultBucket, one
// replica, no TTL, no logs, no metrics.
type Options struct {
	// Bucket is the KV bucket name (letters, digits, '-', '_').
	Bucket string
	// Replicas is the bucket's replica count on a clustered JetStream, 1..5
	// (default 1).
	Replicas int
	// SyncWrites keeps the bucket on the server's own persistence, as the
	// event stream: with "sync_interval: always" (the embedded server's
	// default) every registry write is fsynced before it is acknowledged.
	// Without it (the default) a new single-replica bucket is created with
	// JetStream's async persist mode: a write is acknowledged once it is in
	// the server's memory and reaches the file within milliseconds. A write
	// lost to a crash of the server in that window, or to a power loss
	// before the next sync, costs nothing but the adopt path of §2.5.1
	// (see the package documentation); it halves the fsyncs of every event.
	// A bucket's persist mode is fixed when it is created; replicated
	// buckets (Replicas > 1) always use the default, which the Raft log
	// makes durable.
	SyncWrites bool
	// TTL, when positive, expires an entry TTL after its last write. Zero
	// (the default) keeps entries until the bucket is deleted. See the
	// package documentation for choosing a TTL.
	TTL time.Duration
	// Logger receives adopt notices and debug traces (default zap.NewNop()).
	Logger *zap.Logger
	// Metrics records operations (default nil: none).
	Metrics *Metrics
}

// Registry is the producer EventIdRegistry on a JetStream KV bucket. It is
// safe for concurrent use, and any number of Registry values on any number
// of connections may share one bucket.
type Registry struct {
	entries entries
	log     *zap.Logger
	metrics *Metrics
	streams []string // Streams: the bucket's stream (none on PostgreSQL)
}

// entries is where a Registry keeps its eventIds: a JetStream KV bucket
// (Open) or a PostgreSQL table (OpenPostgres). The Registry validates the
// input first: key is Key(runID, idempotencyKey), eventID a UUID v4.
type entries interface {
	// getOrCreate registers fresh unless the key has an eventId, and
	// returns the stored one.
	getOrCreate(ctx context.Context, runID, idempotencyKey, key, fresh string) (eventID string, created bool, err error)
	adopt(ctx context.Context, runID, idempotencyKey, key, eventID string) (changed bool, err error)
	lookup(ctx context.Context, runID, idempotencyKey, key string) (string, error)
}

// kvEntries keeps the eventIds in a JetStream KV bucket.
type kvEntries struct {
	kv  jetstream.KeyValue
	log *zap.Logger
}

// Open creates the KV bucket described by opts, or binds to an existing
// bucket of that name as it is (never updating it: the sidecar's NATS user
// may not reconfigure streams), and returns a Registry on it. The bucket uses
// file storage and keeps one value per key. Open does not take ownership of
// js or its connection; the Registry holds no other resources.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Registry, error) {
	if opts.Bucket == "" {
		opts.Bucket = DefaultBucket
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.Replicas < 1 || opts.Replicas > 5 {
		return nil, fmt.Errorf("registry: open: replicas must be 1..5, got %d", opts.Replicas)
	}
	if opts.TTL < 0 {
		return nil, fmt.Errorf("registry: open: ttl must not be negative, got %s", opts.TTL)
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if !bucketName.MatchString(opts.Bucket) {
		return nil, fmt.Errorf("registry: open: bucket name %q: want letters, digits, '-' and '_'", opts.Bucket)
	}
	stream := "KV_" + opts.Bucket
	mode := jetstream.DefaultPersistMode
	if opts.Replicas == 1 && !opts.SyncWrites {
		mode = jetstream.AsyncPersistMode
	}
	// Create, never update: the sidecar's NATS user may not reconfigure a
	// stream. An existing bucket keeps its configuration. (Created first,
	// not looked up first: on a cluster, a lookup while a replica starting
	// with this one creates the stream may get no answer at all.)
	_, err := js.CreateStream(ctx, bucketStream(opts, mode))
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		var st jetstream.Stream
		if st, err = natsstore.BindStream(ctx, js, stream); err == nil {
			// The server refuses to change a stream's persist mode.
			if have := st.CachedInfo().Config.PersistMode; have != mode {
				opts.Logger.Info("registry bucket keeps the persist mode it was created with",
					zap.String("bucket", opts.Bucket), zap.Stringer("persistMode", have), zap.Stringer("requested", mode))
				mode = have
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("registry: open bucket %s: %w", opts.Bucket, err)
	}
	kv, err := natsstore.BindBucket(ctx, js, opts.Bucket)
	if err != nil {
		return nil, fmt.Errorf("registry: open bucket %s: %w", opts.Bucket, err)
	}
	log := opts.Logger.Named("registry")
	r := &Registry{entries: &kvEntries{kv: kv, log: log}, log: log, metrics: opts.Metrics, streams: []string{stream}}
	r.log.Debug("opened", zap.String("bucket", opts.Bucket), zap.Int("replicas", opts.Replicas),
		zap.Duration("ttl", opts.TTL), zap.Stringer("persistMode", mode))
	return r, nil
}

var bucketName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// bucketStream is the stream of a KV bucket as nats.go's
// CreateOrUpdateKeyValue makes it (History 1, no size limits, direct get,
// roll-ups, no deletes of the stream's messages), plus the persist mode,
// which the KV API cannot set. A bucket made either way opens with the
// other, and every KV client (nats kv ...) reads it.
func bucketStream(opts Options, mode jetstream.PersistModeType) jetstream.StreamConfig {
	dup := 2 * time.Minute // the KV API's duplicate window, capped by the TTL
	if opts.TTL > 0 && opts.TTL < dup {
		dup = opts.TTL
	}
	return jetstream.StreamConfig{
		Name:              "KV_" + opts.Bucket,
		Description:       "Conductor sidecar producer EventIdRegistry: base64url(runId).idempotencyKey -> eventId (Run Events Contract v2.0.1 §2.5.1)",
		Subjects:          []string{"$KV." + opts.Bucket + ".>"},
		MaxMsgsPerSubject: 1,
		MaxBytes:          -1,
		MaxAge:            opts.TTL,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           jetstream.FileStorage,
		Replicas:          opts.Replicas,
		AllowRollup:       true,
		DenyDelete:        true,
		AllowDirect:       true,
		Duplicates:        dup,
		Discard:           jetstream.DiscardNew,
		PersistMode:       mode,
	}
}

// EventID returns the eventId registered for (runID, idempotencyKey), with
// created false; or, on the first emission, generates a UUID v4, writes it
// with an atomic Create and returns it with created true. The write happens
// before EventID returns, so before the caller appends. When several
// producers race, one Create wins and all of them return its value.
//
// Errors wrap ErrInvalidInput (nothing sent), ErrCorrupt (the stored value is
// not a UUID v4), ErrConflict (the key kept vanishing between a failed Create
// and the read; retry) or ErrUnavailable.
func (r *Registry) EventID(ctx context.Context, runID, idempotencyKey string) (eventID string, created bool, err error) {
	start := time.Now()
	eventID, created, err = r.getOrCreate(ctx, runID, idempotencyKey)
	result := resultFound
	switch {
	case err != nil:
		result = resultError
	case created:
		result = resultCreated
	}
	r.metrics.observe(opGetOrCreate, result, start)
	return eventID, created, err
}

func (r *Registry) getOrCreate(ctx context.Context, runID, idempotencyKey string) (string, bool, error) {
	key, err := Key(runID, idempotencyKey)
	if err != nil {
		return "", false, err
	}
	u, err := uuid.NewRandom()
	if err != nil {
		return "", false, fmt.Errorf("registry: generate eventId: %w", err)
	}
	return r.entries.getOrCreate(ctx, runID, idempotencyKey, key, u.String())
}

func (r *kvEntries) getOrCreate(ctx context.Context, runID, idempotencyKey, key, fresh string) (string, bool, error) {
	// Create first: the first emission is the common case and costs one
	// round trip; a retry costs a failed Create plus a read.
	for range casAttempts {
		_, err := r.kv.Create(ctx, key, []byte(fresh))
		if err == nil {
			r.log.Debug("eventId created", zap.String("runId", runID),
				zap.String("idempotencyKey", idempotencyKey), zap.String("eventId", fresh))
			return fresh, true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", false, unavailable("create", key, err)
		}
		stored, _, err := r.get(ctx, key)
		if errors.Is(err, ErrNotFound) {
			continue // deleted or expired since the Create; create again
		}
		if err != nil {
			return "", false, err
		}
		r.log.Debug("eventId found", zap.String("runId", runID),
			zap.String("idempotencyKey", idempotencyKey), zap.String("eventId", stored))
		return stored, false, nil
	}
	return "", false, fmt.Errorf("%w: key %s: created and found missing %d times", ErrConflict, key, casAttempts)
}

// Adopt registers eventID for (runID, idempotencyKey), replacing any other
// value with a compare-and-set update (or creating the entry if it was
// lost). It is called when the append authority returned a different
// eventId than the producer sent; that eventId is authoritative for the
// rest of the run (§2.5.1). Adopt is idempotent: when eventID is already
// registered it writes nothing.
//
// Errors wrap ErrInvalidInput (nothing sent; eventID must be a UUID v4),
// ErrConflict (concurrent writers won casAttempts times in a row; retry) or
// ErrUnavailable.
func (r *Registry) Adopt(ctx context.Context, runID, idempotencyKey, eventID string) error {
	start := time.Now()
	changed, err := r.adopt(ctx, runID, idempotencyKey, eventID)
	result := resultUnchanged
	switch {
	case err != nil:
		result = resultError
	case changed:
		result = resultAdopted
	}
	r.metrics.observe(opAdopt, result, start)
	return err
}

func (r *Registry) adopt(ctx context.Context, runID, idempotencyKey, eventID string) (bool, error) {
	key, err := Key(runID, idempotencyKey)
	if err != nil {
		return false, err
	}
	if err := validateEventID(eventID); err != nil {
		return false, err
	}
	return r.entries.adopt(ctx, runID, idempotencyKey, key, eventID)
}

func (r *kvEntries) adopt(ctx context.Context, runID, idempotencyKey, key, eventID string) (bool, error) {
	for range casAttempts {
		stored, rev, err := r.get(ctx, key)
		switch {
		case errors.Is(err, ErrNotFound):
			_, err = r.kv.Create(ctx, key, []byte(eventID))
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
			if err != nil {
				return false, unavailable("create", key, err)
			}
			r.log.Info("eventId adopted; registry entry was missing", zap.String("runId", runID),
				zap.String("idempotencyKey", idempotencyKey), zap.String("eventId", eventID))
			return true, nil
		case errors.Is(err, ErrCorrupt):
			// Overwrite a corrupt value: the append authority's eventId is
			// authoritative, and a valid value is better than none.
		case err != nil:
			return false, err
		case stored == eventID:
			return false, nil
		}
		_, err = r.kv.Update(ctx, key, []byte(eventID), rev)
		// Check ErrKeyRevisionMismatch first: on a single server a CAS
		// conflict also matches jetstream.ErrKeyExists (same API code).
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return false, unavailable("update", key, err)
		}
		r.log.Info("eventId adopted from the append authority", zap.String("runId", runID),
			zap.String("idempotencyKey", idempotencyKey), zap.String("previousEventId", stored),
			zap.String("eventId", eventID))
		return true, nil
	}
	return false, fmt.Errorf("%w: key %s: lost %d compare-and-set rounds", ErrConflict, key, casAttempts)
}

// Lookup returns the eventId registered for (runID, idempotencyKey) without
// creating one. Errors wrap ErrInvalidInput, ErrNotFound, ErrCorrupt or
// ErrUnavailable.
func (r *Registry) Lookup(ctx context.Context, runID, idempotencyKey string) (string, error) {
	start := time.Now()
	eventID, err := r.lookup(ctx, runID, idempotencyKey)
	result := resultFound
	switch {
	case errors.Is(err, ErrNotFound):
		result = resultNotFound
	case err != nil:
		result = resultError
	}
	r.metrics.observe(opLookup, result, start)
	return eventID, err
}

func (r *Registry) lookup(ctx context.Context, runID, idempotencyKey string) (string, error) {
	key, err := Key(runID, idempotencyKey)
	if err != nil {
		return "", err
	}
	return r.entries.lookup(ctx, runID, idempotencyKey, key)
}

func (r *kvEntries) lookup(ctx context.Context, _, _, key string) (string, error) {
	eventID, _, err := r.get(ctx, key)
	return eventID, err
}

// get reads key. A missing (or deleted) key gives ErrNotFound; a value that
// is not a UUID v4 gives ErrCorrupt together with the entry's revision.
func (r *kvEntries) get(ctx context.Context, key string) (string, uint64, error) {
	e, err := r.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", 0, fmt.Errorf("%w: key %s", ErrNotFound, key)
	}
	if err != nil {
		return "", 0, unavailable("get", key, err)
	}
	v := string(e.Value())
	if !isUUIDv4(v) {
		return "", e.Revision(), fmt.Errorf("%w: key %s holds %q", ErrCorrupt, key, v)
	}
	return v, e.Revision(), nil
}

func unavailable(op, key string, err error) error {
	return fmt.Errorf("%w: %s key %s: %w", ErrUnavailable, op, key, err)
}

// Streams are the JetStream streams the registry keeps its eventIds in:
// its bucket's (none on PostgreSQL).
func (r *Registry) Streams() []string { return append([]string(nil), r.streams...) }
