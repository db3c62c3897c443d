package natsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// OpenBucket creates the KV bucket cfg describes, or binds to it as it is
// when it exists: the sidecar's NATS user may not update buckets
// (docs/jetstream.md), so a bucket an administrator configured otherwise
// (more replicas, say) is kept as it is. The bucket it returns refuses keys
// longer than MaxKeyBytes and bounds each request's wait (BoundKeys), and
// on a connection to the embedded server (Embedded.Connect) refuses every
// write with STORE_WRITE_REFUSED, without a request, while the server
// reports a write error of the bucket's stream (see Embedded.Check).
func OpenBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return BindBucket(ctx, js, cfg.Bucket)
	}
	if err != nil {
		return nil, err
	}
	return BoundKeys(js, kv), nil
}

// BindBucket binds to the KV bucket that the caller has just created or
// was told exists, as BoundKeys returns it. On a cluster the stream of a
// bucket created an instant ago (by this process or by a replica starting
// with it) may not be served by its replicas yet, and the lookup answers
// "not found": that error matches ErrNotReady, for the open to be tried
// again.
func BindBucket(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: bucket %s was just created: %w", ErrNotReady, bucket, err)
	}
	if err != nil {
		return nil, err
	}
	return BoundKeys(js, kv), nil
}

// BindStream is BindBucket for a stream that the caller has just created
// or was told exists.
func BindStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: stream %s was just created: %w", ErrNotReady, name, err)
	}
	return st, err
}

// BoundKeys returns kv, opened through js, refusing, with ErrKeyTooLong
// and without a request, every key (or watched key pattern) longer than
// MaxKeyBytes. A key is part of the subject of every request about it;
// one longer than the server's control line makes the server close the
// connection, which cuts the whole process off its store. Each of its
// single requests (get, put, create, update, delete, purge, status) waits
// for its answer at most js's default timeout, whatever the caller's
// context allows: nats.go waits until the context ends, and a request
// lost with a NATS node that died has no answer coming (a step's emit
// with a deadline an hour away waited the hour). On a connection to the
// embedded server its writes fail fast as OpenBucket's do.
func BoundKeys(js jetstream.JetStream, kv jetstream.KeyValue) jetstream.KeyValue {
	if b, ok := kv.(boundedKV); ok {
		return b
	}
	timeout := js.Options().DefaultTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	return boundedKV{KeyValue: kv, guard: guardOf(js.Conn(), "KV_"+kv.Bucket()), timeout: timeout}
}

type boundedKV struct {
	jetstream.KeyValue
	// guard fails writes fast while the bucket's stream refuses them.
	guard writeGuard
	// timeout bounds each single request's wait for its answer.
	timeout time.Duration
}

func (b boundedKV) request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.timeout)
}

func checkKeys(keys ...string) error {
	for _, k := range keys {
		if len(k) > MaxKeyBytes {
			return fmt.Errorf("%w: %d bytes; the limit is %d", ErrKeyTooLong, len(k), MaxKeyBytes)
		}
	}
	return nil
}

func (b boundedKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if err := checkKeys(key); err != nil {
		return nil, err
	}
	ctx, cancel := b.request(ctx)
	defer cancel()
	return b.KeyValue.Get(ctx, key)
}

func (b boundedKV) GetRevision(ctx context.Context, key string, revision uint64) (jetstream.KeyValueEntry, error) {
	if err := checkKeys(key); err != nil {
		return nil, err
	}
	ctx, cancel := b.request(ctx)
	defer cancel()
	return b.KeyValue.GetRevision(ctx, key, revision)
}

func (b boundedKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	if err := checkKeys(key); err != nil {
		return 0, err
	}
	ctx, cancel := b.request(ctx)
	defer cancel()
	if err := b.guard.before(); err != nil {
		return 0, err
	}
	rev, err := b.KeyValue.Put(ctx, key, value)
	return rev, b.guard.after(err)
}

func (b boundedKV) PutString(ctx context.Context, key string, value string) (uint64, error) {
	if err := checkKeys(key); err != nil {
		return 0, err
	}
	ctx, cancel := b.request(ctx)
	defer cancel()
	if err := b.guard.before(); err != nil {
		return 0, err
	}
	rev, err := b.KeyValue.PutString(ctx, key, value)
	return rev, b.guard.after(err)
}

func (b boundedKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if err := checkKeys(key); err != nil {
		return 0, err
	}
	ctx, cancel := b.request(ctx)
	defer cancel()
	if err := b.guard.before(); err != nil {
		return 0, err
	}
	rev, err := b.KeyValue.Create(ctx, key, value, opts...)
	return rev, b.guard.after(err)
}

func (b boundedKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if err := checkKeys(key); err != nil {
		return 0, err
	}
	ctx, cancel := b.request(ctx)
	defer cancel()
	if err := b.guard.before(); err != nil {
		return 0, err
	}
	rev, err := b.KeyValue.Update(ctx, key, value, revision)
	return rev, b.guard.after(err)
}

func (b boundedKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	if err := checkKeys(key); err != nil {
		return err
	}
	ctx, cancel := b.request(ctx)
	defer cancel()
	if err := b.guard.before(); err != nil {
		return err
	}
	return b.guard.after(b.KeyValue.Delete(ctx, key, opts...))
}

func (b boundedKV) Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	if err := checkKeys(key); err != nil {
		return err
	}
	ctx, cancel := b.request(ctx)
	defer cancel()
	if err := b.guard.before(); err != nil {
		return err
	}
	return b.guard.after(b.KeyValue.Purge(ctx, key, opts...))
}

func (b boundedKV) Status(ctx context.Context) (jetstream.KeyValueStatus, error) {
	ctx, cancel := b.request(ctx)
	defer cancel()
	return b.KeyValue.Status(ctx)
}

func (b boundedKV) Watch(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	if err := checkKeys(keys); err != nil {
		return nil, err
	}
	return b.KeyValue.Watch(ctx, keys, opts...)
}

func (b boundedKV) WatchFiltered(ctx context.Context, keys []string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	if err := checkKeys(keys...); err != nil {
		return nil, err
	}
	return b.KeyValue.WatchFiltered(ctx, keys, opts...)
}

func (b boundedKV) ListKeysFiltered(ctx context.Context, filters ...string) (jetstream.KeyLister, error) {
	if err := checkKeys(filters...); err != nil {
		return nil, err
	}
	return b.KeyValue.ListKeysFiltered(ctx, filters...)
}

func (b boundedKV) History(ctx context.Context, key string, opts ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	if err := checkKeys(key); err != nil {
		return nil, err
	}
	return b.KeyValue.History(ctx, key, opts...)
}
