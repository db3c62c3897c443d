// Package artifacts keeps step outputs (captured stdout and stderr, HTTP
// response bodies) in a JetStream object store and hands out references
// (statestore.ArtifactRef) for the event log, which never carries the bytes.
//
// # Names and URIs
//
// An artifact is addressed by its Key: the run, the step, the logical and
// engine attempt (one engine try) and a short name. Its object name is
//
//	<runToken>/<stepToken>/<logicalAttemptId>/<engineAttemptId>/<name>
//
// where a token is the unpadded base64url encoding of the UTF-8 id (the
// same encoding as natsstore.RunToken), so any runId or stepId (dots,
// slashes, spaces, wildcards, Unicode) yields a safe name. The reference's
// URI is
//
//	nats-os://<bucket>/<object name>
//
// for instance nats-os://SIDECAR_ARTIFACTS/cnVuLTE/YnVpbGQ/1/2/stdout for
// run "run-1", step "build", logical attempt 1, engine try 2.
//
// # Re-putting a key
//
// A key names one engine try, so it is written again only when the same try
// runs twice (a redelivery after a worker crash). Put then never
// overwrites: the second object gets the key's name plus "." and a random
// suffix, and every reference keeps reading the bytes it was made for.
// Overwriting would purge the old object's chunks, which the sidecar's
// NATS user may not do (the server refuses, and the put waits out a
// timeout).
package artifacts

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// DefaultBucket is the object store bucket used when Options.Bucket is empty.
const DefaultBucket = "SIDECAR_ARTIFACTS"

// Scheme is the URI scheme of the references this package makes.
const Scheme = "nats-os"

// maxObjectName bounds an object name. Its base64 form is part of a NATS
// subject, and a subject near 4 KiB closes the connection.
const maxObjectName = 1024

// Metadata keys stored with each object.
const (
	metaKind    = "kind"
	metaRunID   = "runId"
	metaStepID  = "stepId"
	metaLogical = "logicalAttemptId"
	metaEngine  = "engineAttemptId"
)

// Sentinel errors, matched with errors.Is.
var (
	// ErrNotFound: no artifact has that URI (never written, deleted or
	// expired).
	ErrNotFound = errors.New("artifacts: not found")
	// ErrInvalidKey: a Key or kind is malformed; nothing was written.
	ErrInvalidKey = errors.New("artifacts: invalid key")
	// ErrInvalidURI: the URI is not nats-os://<bucket>/<object name> of this
	// store's bucket.
	ErrInvalidURI = errors.New("artifacts: invalid uri")
	// ErrIntegrity: the bytes the store acknowledged do not match what was
	// sent (sha256 or size differ).
	ErrIntegrity = errors.New("artifacts: integrity check failed")
)

// Options configure Open.
type Options struct {
	// Bucket is the object store bucket (default DefaultBucket).
	Bucket string
	// Replicas of the bucket's stream when Open creates it (default 1).
	Replicas int
	// TTL is how long objects are kept when Open creates the bucket; zero
	// keeps them until deleted. References get ExpiresAt = write time + TTL.
	TTL time.Duration
	// Logger (default nop).
	Logger *zap.Logger
}

// Store is an artifact store on one JetStream object store bucket. It is
// safe for concurrent use.
type Store struct {
	obs    jetstream.ObjectStore
	bucket string
	ttl    time.Duration
	log    *zap.Logger
}

// Open binds the bucket, creating it with opts when it does not exist. An
// existing bucket is used as it is: its TTL (which then also sets
// ExpiresAt) and replicas win over opts, with a warning when they differ.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Store, error) {
	if opts.Bucket == "" {
		opts.Bucket = DefaultBucket
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	log := opts.Logger.Named("artifacts")
	obs, err := js.ObjectStore(ctx, opts.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      opts.Bucket,
			Description: "conductor sidecar step artifacts",
			TTL:         opts.TTL,
			Replicas:    opts.Replicas,
			Storage:     jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Another replica created it first, with other options.
			obs, err = js.ObjectStore(ctx, opts.Bucket)
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				// Created an instant ago, not served by its replicas yet.
				err = fmt.Errorf("%w: %w", natsstore.ErrNotReady, err)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open artifact bucket %s: %w", opts.Bucket, err)
	}
	st, err := obs.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("artifact bucket %s status: %w", opts.Bucket, err)
	}
	if st.TTL() != opts.TTL || st.Replicas() != opts.Replicas {
		log.Warn("artifact bucket exists with other settings; using them",
			zap.String("bucket", opts.Bucket), zap.Duration("ttl", st.TTL()), zap.Int("replicas", st.Replicas()),
			zap.Duration("wantTTL", opts.TTL), zap.Int("wantReplicas", opts.Replicas))
	}
	return &Store{obs: obs, bucket: opts.Bucket, ttl: st.TTL(), log: log}, nil
}

// Bucket returns the store's bucket name.
func (s *Store) Bucket() string { return s.bucket }

// Key addresses one artifact of one engine try of a step.
type Key struct {
	RunID            string
	StepID           string
	LogicalAttemptID int64
	EngineAttemptID  int64
	// Name tells the try's artifacts apart ("stdout", "stderr",
	// "http-response"): 1 to 64 of [A-Za-z0-9._-], not "." or "..".
	Name string
}

var nameRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ObjectName returns the key's object name (see the package doc), or an
// error wrapping ErrInvalidKey.
func (k Key) ObjectName() (string, error) {
	switch {
	case k.RunID == "":
		return "", fmt.Errorf("%w: runId is empty", ErrInvalidKey)
	case k.StepID == "":
		return "", fmt.Errorf("%w: stepId is empty", ErrInvalidKey)
	case k.LogicalAttemptID < 1 || k.EngineAttemptID < 1:
		return "", fmt.Errorf("%w: attempts must be >= 1, got logical %d engine %d", ErrInvalidKey, k.LogicalAttemptID, k.EngineAttemptID)
	case !nameRe.MatchString(k.Name) || k.Name == "." || k.Name == "..":
		return "", fmt.Errorf("%w: name %q must be 1-64 of [A-Za-z0-9._-]", ErrInvalidKey, k.Name)
	}
	name := token(k.RunID) + "/" + token(k.StepID) + "/" + strconv.FormatInt(k.LogicalAttemptID, 10) + "/" +
		strconv.FormatInt(k.EngineAttemptID, 10) + "/" + k.Name
	if len(name) > maxObjectName {
		return "", fmt.Errorf("%w: object name is %d bytes (runId and stepId too long), max %d", ErrInvalidKey, len(name), maxObjectName)
	}
	return name, nil
}

// token is natsstore.RunToken's encoding: unpadded base64url of the bytes.
func token(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// URI returns the reference URI of an object name in this store.
func (s *Store) URI(objectName string) string {
	return Scheme + "://" + s.bucket + "/" + objectName
}

// ParseURI splits nats-os://<bucket>/<object name>.
func ParseURI(uri string) (bucket, objectName string, err error) {
	rest, ok := strings.CutPrefix(uri, Scheme+"://")
	if !ok {
		return "", "", fmt.Errorf("%w: %q does not start with %s://", ErrInvalidURI, uri, Scheme)
	}
	bucket, objectName, ok = strings.Cut(rest, "/")
	if !ok || bucket == "" || objectName == "" {
		return "", "", fmt.Errorf("%w: %q is not %s://<bucket>/<object>", ErrInvalidURI, uri, Scheme)
	}
	return bucket, objectName, nil
}

// Put streams r into the artifact of key, computing its sha256 and size
// while writing, and returns its reference. kind (1 to 64 printable ASCII
// bytes, e.g. "stdout") is stored with the object and returned by Get.
// Re-putting a key overwrites it (see the package doc). Put reads r to EOF
// or to its first error; on error nothing is stored under key (a previous
// object, if any, stays). ctx bounds the whole write.
func (s *Store) Put(ctx context.Context, key Key, kind string, r io.Reader) (statestore.ArtifactRef, error) {
	name, err := key.ObjectName()
	if err != nil {
		return statestore.ArtifactRef{}, err
	}
	if err := checkKind(kind); err != nil {
		return statestore.ArtifactRef{}, err
	}
	switch _, err := s.obs.GetInfo(ctx, name); {
	case err == nil:
		name += "." + rand.Text()[:8] // the same try again: a name of its own
	case !errors.Is(err, jetstream.ErrObjectNotFound):
		return statestore.ArtifactRef{}, fmt.Errorf("put artifact %s: %w", s.URI(name), err)
	}
	h := &hashCounter{h: sha256.New()}
	info, err := s.obs.Put(ctx, jetstream.ObjectMeta{
		Name: name,
		Metadata: map[string]string{
			metaKind: kind, metaRunID: key.RunID, metaStepID: key.StepID,
			metaLogical: strconv.FormatInt(key.LogicalAttemptID, 10),
			metaEngine:  strconv.FormatInt(key.EngineAttemptID, 10),
		},
	}, io.TeeReader(r, h))
	if err != nil {
		return statestore.ArtifactRef{}, fmt.Errorf("put artifact %s: %w", s.URI(name), err)
	}
	sum := hex.EncodeToString(h.h.Sum(nil))
	stored, err := digestHex(info.Digest)
	if err != nil || stored != sum || info.Size != uint64(h.n) {
		return statestore.ArtifactRef{}, fmt.Errorf("%w: put %s: sent %d bytes sha256 %s, store has %d bytes digest %q",
			ErrIntegrity, s.URI(name), h.n, sum, info.Size, info.Digest)
	}
	ref := statestore.ArtifactRef{URI: s.URI(name), Kind: kind, SHA256: sum, SizeBytes: h.n}
	if s.ttl > 0 {
		ref.ExpiresAt = time.Now().Add(s.ttl).UTC().Format(time.RFC3339Nano)
	}
	return ref, nil
}

func checkKind(kind string) error {
	if kind == "" || len(kind) > 64 {
		return fmt.Errorf("%w: kind must be 1-64 bytes", ErrInvalidKey)
	}
	for i := 0; i < len(kind); i++ {
		if kind[i] < 0x21 || kind[i] > 0x7e {
			return fmt.Errorf("%w: kind %q must be printable ASCII without spaces", ErrInvalidKey, kind)
		}
	}
	return nil
}

// Get opens the artifact at uri for reading and returns its reference as
// stored (sha256 and size of the current bytes, kind, and ExpiresAt from
// the store's write time when the bucket has a TTL). Reading honours ctx
// and fails with jetstream.ErrDigestMismatch at EOF if the bytes read do
// not match the stored sha256. The caller closes the reader. A URI of
// another bucket or a malformed one gives ErrInvalidURI; a missing object
// ErrNotFound.
func (s *Store) Get(ctx context.Context, uri string) (io.ReadCloser, statestore.ArtifactRef, error) {
	bucket, name, err := ParseURI(uri)
	if err != nil {
		return nil, statestore.ArtifactRef{}, err
	}
	if bucket != s.bucket {
		return nil, statestore.ArtifactRef{}, fmt.Errorf("%w: bucket %q, this store is %q", ErrInvalidURI, bucket, s.bucket)
	}
	res, err := s.obs.Get(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, statestore.ArtifactRef{}, fmt.Errorf("%w: %s", ErrNotFound, uri)
	}
	if err != nil {
		return nil, statestore.ArtifactRef{}, fmt.Errorf("get artifact %s: %w", uri, err)
	}
	info, err := res.Info()
	if err != nil {
		res.Close()
		return nil, statestore.ArtifactRef{}, fmt.Errorf("get artifact %s: %w", uri, err)
	}
	sum, err := digestHex(info.Digest)
	if err != nil {
		res.Close()
		return nil, statestore.ArtifactRef{}, fmt.Errorf("get artifact %s: %w", uri, err)
	}
	ref := statestore.ArtifactRef{URI: uri, Kind: info.Metadata[metaKind], SHA256: sum, SizeBytes: int64(info.Size)}
	if s.ttl > 0 && !info.ModTime.IsZero() {
		ref.ExpiresAt = info.ModTime.Add(s.ttl).UTC().Format(time.RFC3339Nano)
	}
	return res, ref, nil
}

// digestHex turns the object store's "SHA-256=<base64url>" into lowercase hex.
func digestHex(d string) (string, error) {
	b, err := jetstream.DecodeObjectDigest(d)
	if err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("%w: bad digest %q", ErrIntegrity, d)
	}
	return hex.EncodeToString(b), nil
}

type hashCounter struct {
	h hash.Hash
	n int64
}

func (c *hashCounter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

// Streams are the JetStream streams the store keeps artifacts in: its
// object store's.
func (s *Store) Streams() []string { return []string{"OBJ_" + s.bucket} }
