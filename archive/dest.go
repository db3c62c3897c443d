package archive

import (
	"context"
	"net/url"
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
	// ErrObjectNotFound.
	Get(ctx context.Context, name string) ([]byte, error)
	// List returns the names of the objects under prefix, sorted.
	List(ctx context.Context, prefix string) ([]string, error)
	// String is the destination's URL without credentials.
	String() string
}

// ParseURL opens the destination an --archive URL names:
// file:///absolute/dir (a directory, made if missing).
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
		return NewDir(u.Path), nil
	default:
		return nil, newError(CodeURLInvalid, nil, "%q: the archive is a file:///dir URL", raw)
	}
}
