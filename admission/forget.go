package admission

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// KeyPurger purges keys of a KV bucket so that no delete marker stays
// (natsstore.KeyPurger, on the retention user's connection).
type KeyPurger interface {
	// PurgeKeys purges keys from bucket; keys that are absent, or could
	// not be KV keys, are skipped.
	PurgeKeys(ctx context.Context, bucket string, keys ...string) error
}

// Forgetter drops a run's admission entry when the run leaves hot state
// (retention), with the delete marker the decider leaves once an entry is
// decided.
type Forgetter struct {
	c      *Controller
	purger KeyPurger
}

// NewForgetter returns the forgetter of c's bucket, purging through
// purger.
func NewForgetter(c *Controller, purger KeyPurger) *Forgetter {
	return &Forgetter{c: c, purger: purger}
}

// ForgetRun drops runID's entry. An entry still there is deleted through
// the bucket first, so that every replica's mirror of the bucket (which
// watches it) lets go of it, then its subject is purged. It is
// idempotent: a run without an entry is nothing to do.
func (f *Forgetter) ForgetRun(ctx context.Context, runID string) error {
	key := keyOf(runID)
	_, err := f.c.kv.Get(ctx, key)
	switch {
	case err == nil:
		if err := f.c.kv.Delete(ctx, key); err != nil {
			return unavailable("forget run", err)
		}
	case !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
		return unavailable("forget run", err)
	}
	return f.purger.PurgeKeys(ctx, Bucket, key)
}
