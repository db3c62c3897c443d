// Package keep keeps, in a JetStream KV bucket, the outputs outside
// workers reported with an outcome the log recorded but whose update did
// not reach Conductor, so that the step's next try is answered with them by
// whichever replica or process Conductor offers it to
// (taskworkers.Options.OutputKeep).
//
// An output is stored gzipped, in parts of at most partBytes (a KV value
// is one NATS message): the parts first, then the head that counts them,
// so that a reader never sees a head without its parts. The sidecar's NATS
// user may not purge (docs/security.md), which rules out an object store:
// replacing or deleting an object purges its chunks. A KV delete is a
// marker, and the bucket's TTL ends every entry and marker.
package keep

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// DefaultBucket is the KV bucket used when Options.Bucket is empty.
const DefaultBucket = "SIDECAR_UNREPORTED"

// Defaults of Options.TTL and Options.MaxBytes.
const (
	DefaultTTL      = time.Hour
	DefaultMaxBytes = 256 << 20
)

// partBytes bounds one part: well under NATS's default max_payload (1 MiB).
const partBytes = 512 << 10

// maxParts bounds an output (partBytes each, after gzip): 64 MiB, above
// any update body the proxy takes.
const maxParts = 128

// Options configures Open.
type Options struct {
	// Bucket is the KV bucket (default DefaultBucket).
	Bucket string
	// Replicas of the bucket's stream (default 1).
	Replicas int
	// TTL is how long an output is kept (default DefaultTTL): Conductor
	// offers the step's next try after its response timeout, within it
	// for any step of a sane timeout.
	TTL time.Duration
	// MaxBytes bounds the bucket (default DefaultMaxBytes): past it, a
	// Put fails and the caller keeps the output in its memory only.
	MaxBytes int64
}

// Store is the bucket. It is safe for concurrent use.
type Store struct {
	kv     jetstream.KeyValue
	bucket string
}

// Open binds the bucket, creating it with opts when it does not exist (an
// existing one is used as it is: natsstore.OpenBucket).
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Store, error) {
	if opts.Bucket == "" {
		opts.Bucket = DefaultBucket
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	kv, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      opts.Bucket,
		Description: "conductor sidecar: outside workers' outputs Conductor has not taken yet",
		TTL:         opts.TTL,
		MaxBytes:    opts.MaxBytes,
		Replicas:    opts.Replicas,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", opts.Bucket, err)
	}
	return &Store{kv: kv, bucket: opts.Bucket}, nil
}

// head is what the key of an output holds.
type head struct {
	Parts int `json:"parts"`
}

// key is name's key: any name, in the characters a key allows.
func key(name string) string { return base64.RawURLEncoding.EncodeToString([]byte(name)) }

func partKey(k string, i int) string { return fmt.Sprintf("%s.p%d", k, i) }

// Put keeps data under name, replacing what was kept under it.
func (s *Store) Put(ctx context.Context, name string, data []byte) error {
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	_, _ = zw.Write(data)
	_ = zw.Close()
	packed := z.Bytes()
	n := (len(packed) + partBytes - 1) / partBytes
	if n > maxParts {
		return fmt.Errorf("keep %s: %d bytes gzipped, more than the %d the bucket takes", name, len(packed), maxParts*partBytes)
	}
	k := key(name)
	for i := range n {
		if _, err := s.kv.Put(ctx, partKey(k, i), packed[i*partBytes:min(len(packed), (i+1)*partBytes)]); err != nil {
			return fmt.Errorf("keep %s in %s: %w", name, s.bucket, err)
		}
	}
	h, _ := json.Marshal(head{Parts: n})
	if _, err := s.kv.Put(ctx, k, h); err != nil {
		return fmt.Errorf("keep %s in %s: %w", name, s.bucket, err)
	}
	return nil
}

// Get returns what is kept under name; nil, nil when nothing is (or it
// expired).
func (s *Store) Get(ctx context.Context, name string) ([]byte, error) {
	k := key(name)
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s from %s: %w", name, s.bucket, err)
	}
	var h head
	if err := json.Unmarshal(e.Value(), &h); err != nil || h.Parts < 0 || h.Parts > maxParts {
		return nil, fmt.Errorf("read %s from %s: a damaged head %q", name, s.bucket, e.Value())
	}
	var packed []byte
	for i := range h.Parts {
		p, err := s.kv.Get(ctx, partKey(k, i))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, nil // expired under its head: nothing kept
		}
		if err != nil {
			return nil, fmt.Errorf("read %s from %s: %w", name, s.bucket, err)
		}
		packed = append(packed, p.Value()...)
	}
	zr, err := gzip.NewReader(bytes.NewReader(packed))
	if err != nil {
		return nil, fmt.Errorf("read %s from %s: %w", name, s.bucket, err)
	}
	data, err := io.ReadAll(io.LimitReader(zr, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s from %s: %w", name, s.bucket, err)
	}
	return data, nil
}

// Delete drops what is kept under name (its head: the parts expire);
// nothing kept is no error.
func (s *Store) Delete(ctx context.Context, name string) error {
	if err := s.kv.Delete(ctx, key(name)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("drop %s from %s: %w", name, s.bucket, err)
	}
	return nil
}

// Streams names the bucket's stream (the node's readiness guard).
func (s *Store) Streams() []string { return []string{"KV_" + s.bucket} }
