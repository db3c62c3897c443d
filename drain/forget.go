package drain

import "context"

// KeyPurger purges keys of a KV bucket so that no delete marker stays
// (natsstore.KeyPurger, on the retention user's connection).
type KeyPurger interface {
	// PurgeKeys purges keys from bucket; keys that are absent, or could
	// not be KV keys, are skipped.
	PurgeKeys(ctx context.Context, bucket string, keys ...string) error
}

// KeysForgetter drops a run's keys from the pause bucket when the run
// leaves hot state (retention): its drain mark, its scheduled resume and
// its engine ledger entry, with the delete markers an ended drain or
// resume left.
type KeysForgetter struct {
	bucket string
	purger KeyPurger
}

// NewKeysForgetter returns the forgetter of keys' bucket, purging through
// purger.
func NewKeysForgetter(keys *Keys, purger KeyPurger) *KeysForgetter {
	return &KeysForgetter{bucket: keys.kv.Bucket(), purger: purger}
}

// ForgetRun purges runID's keys. Purging keys that are gone, or never
// were, is harmless, so it is idempotent. A finished run has no open
// drain or pending resume to lose: retention forgets only finished runs.
func (f *KeysForgetter) ForgetRun(ctx context.Context, runID string) error {
	return f.purger.PurgeKeys(ctx, f.bucket, keyDrain+runID, keyResume+runID, keyEngine+runID)
}
