package archive

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
)

// Destination is where an archive's objects live: a directory, a bucket
// prefix. Names are slash-separated paths relative to the archive's root
// ("manifests/000000000001.json"). Implementations are safe for
// concurrent use.
type Destination interface {
	// Put stores data under name, replacing any object of that name. When
	// it returns nil the object is durable and whole: a reader never sees
	// part of it.
	Put(ctx context.Context, name string, data []byte) error
	// PutNew is Put for a name that must not exist yet: if an object of
	// that name exists, nothing is written and the error matches
	// ErrConflict. Two writers racing for one name: one wins.
	PutNew(ctx context.Context, name string, data []byte) error
	// Get returns the object's bytes, or an error matching
	// ErrObjectNotFound, or ErrCorrupt when the object is larger than
	// limit bytes (it is not read whole) or the destination checks the
	// bytes against a checksum it stored with them and they differ.
	Get(ctx context.Context, name string, limit int64) ([]byte, error)
	// List returns the names of the objects under prefix, sorted.
	List(ctx context.Context, prefix string) ([]string, error)
	// String is the destination's URL without credentials.
	String() string
}

// ParseURL opens the destination an --archive URL names:
// file:///absolute/dir (a directory, made if missing), or
// s3://bucket/prefix (a prefix of an S3 bucket; ParseS3URL).
func ParseURL(raw string) (Destination, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, newError(CodeURLInvalid, err, "%q", raw)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, newError(CodeURLInvalid, nil, "%q: file:// takes an absolute path and no host (file:///var/lib/sidecar/archive)", raw)
		}
		if !strings.HasPrefix(u.Path, "/") || u.RawQuery != "" || u.Fragment != "" {
			return nil, newError(CodeURLInvalid, nil, "%q: file:// takes an absolute path (file:///var/lib/sidecar/archive)", raw)
		}
		if strings.ContainsRune(u.Path, 0) {
			return nil, newError(CodeURLInvalid, nil, "%q: a path holds no NUL byte (%%00): no file system takes it", raw)
		}
		return NewDir(u.Path), nil
	case "s3":
		cfg, err := ParseS3URL(raw, os.Getenv)
		if err != nil {
			return nil, err
		}
		return NewS3(context.Background(), cfg)
	default:
		return nil, newError(CodeURLInvalid, nil, "%q: the archive is a file:///dir or s3://bucket/prefix URL", raw)
	}
}

// ParseS3URL reads s3://bucket/prefix[?path-style=true|false] into an
// S3Config, with the endpoint from getenv's AWS_ENDPOINT_URL_S3 or
// AWS_ENDPOINT_URL; region and credentials are left to the SDK's default
// chain (AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, profiles,
// roles). path-style defaults to true when an endpoint is set (an
// S3-compatible server) and to false otherwise (AWS S3). Credentials in
// the URL are refused: they would end up in logs and process listings.
func ParseS3URL(raw string, getenv func(string) string) (S3Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return S3Config{}, newError(CodeURLInvalid, err, "%q", raw)
	}
	if u.Scheme != "s3" {
		return S3Config{}, newError(CodeURLInvalid, nil, "%q: not an s3:// URL", raw)
	}
	if u.User != nil {
		return S3Config{}, newError(CodeURLInvalid, nil, "s3 URL with credentials: give them as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	if u.Port() != "" || u.Fragment != "" || u.Opaque != "" {
		return S3Config{}, newError(CodeURLInvalid, nil, "%q: s3:// takes a bucket and a key prefix (s3://bucket/prefix); the endpoint is AWS_ENDPOINT_URL_S3", raw)
	}
	cfg := S3Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
	if strings.Contains(u.Path, "//") {
		return S3Config{}, newError(CodeURLInvalid, nil, "%q: empty segment in the key prefix", raw)
	}
	if getenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") != "true" {
		cfg.Endpoint = getenv("AWS_ENDPOINT_URL_S3")
		if cfg.Endpoint == "" {
			cfg.Endpoint = getenv("AWS_ENDPOINT_URL")
		}
	}
	cfg.PathStyle = cfg.Endpoint != ""
	q := u.Query()
	for k := range q {
		if k != "path-style" {
			return S3Config{}, newError(CodeURLInvalid, nil, "%q: unknown option %q (only path-style=true|false)", raw, k)
		}
	}
	if v, ok := q["path-style"]; ok {
		switch {
		case len(v) == 1 && v[0] == "true":
			cfg.PathStyle = true
		case len(v) == 1 && v[0] == "false":
			cfg.PathStyle = false
		default:
			return S3Config{}, newError(CodeURLInvalid, nil, "%q: path-style is true or false", raw)
		}
	}
	if !bucketName.MatchString(cfg.Bucket) {
		return S3Config{}, newError(CodeURLInvalid, nil, "%q: bucket name %q (3 to 63 of a-z, 0-9, '.', '-')", raw, cfg.Bucket)
	}
	if cfg.Prefix != "" && checkName(cfg.Prefix) != nil {
		return S3Config{}, newError(CodeURLInvalid, nil, "%q: key prefix %q", raw, cfg.Prefix)
	}
	return cfg, nil
}

// Bounds of the objects a reader takes: no manifest or catalog shard the
// writer makes comes near them (a manifest of 200 runs with their labels
// is a few hundred KiB, a shard tens of KiB), and a segment is bounded by
// its manifest's segmentBytes (and maxRawBytes). A larger object is damage
// or a hostile write, refused before it is read whole.
const (
	maxManifestBytes = 16 << 20
	maxShardBytes    = 16 << 20
)

// tooLarge is the error of an object of size bytes read with a limit.
func tooLarge(name string, size, limit int64) error {
	return newError(CodeCorrupt, nil, "%s is %d bytes, more than the %d expected: not read", name, size, limit)
}

// readAtMost reads r to its end, or fails with an error matching
// ErrCorrupt once more than limit bytes came; what was read comes with
// any other error.
func readAtMost(r io.Reader, limit int64) ([]byte, error) {
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(r, limit+1))
	if err != nil {
		return buf.Bytes(), err
	}
	if n > limit {
		return nil, fmt.Errorf("%w: more than the %d bytes expected", ErrCorrupt, limit)
	}
	return buf.Bytes(), nil
}
