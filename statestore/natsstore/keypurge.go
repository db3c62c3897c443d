package natsstore

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// KeyPurger purges single keys of KV buckets with a per-subject purge of
// the bucket's stream, so that neither the key's value nor a delete marker
// stays. It works on a connection as RetentionUser, which may purge the
// buckets RetentionPermissions names; the owning packages' Forgetters use
// it to drop a run's keys when the run leaves hot state.
type KeyPurger struct {
	js jetstream.JetStream
}

// NewKeyPurger returns a KeyPurger on js (a connection as RetentionUser).
func NewKeyPurger(js jetstream.JetStream) *KeyPurger { return &KeyPurger{js: js} }

// PurgeKeys purges keys from bucket. A key that is not a valid KV key (a
// wildcard, an empty token, a character KV keys do not allow) cannot be
// in the bucket and is skipped, so that a run id like ">" never widens
// the purge. A bucket that does not exist has nothing to purge. Purging a
// key again, or a key that never existed, is harmless.
func (p *KeyPurger) PurgeKeys(ctx context.Context, bucket string, keys ...string) error {
	st, err := p.js.Stream(ctx, "KV_"+bucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return unavailable("open bucket "+bucket+" for purge", err)
	}
	for _, k := range keys {
		if !plainKVKey(k) {
			continue
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+"."+k)); err != nil {
			return unavailable("purge a key of "+bucket, err)
		}
	}
	return nil
}

// plainKVKey reports whether k is a KV key without wildcards: 1 to
// MaxKeyBytes of -/_=.0-9A-Za-z, no empty token between dots.
func plainKVKey(k string) bool {
	if k == "" || len(k) > MaxKeyBytes || strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") || strings.Contains(k, "..") {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '-' || c == '/' || c == '_' || c == '=' || c == '.' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}
