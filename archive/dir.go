package archive

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

var _ Destination = (*Dir)(nil)

// Dir is a Destination in a directory of a local or mounted file system.
// An object is written to a temporary file in its directory, fsynced, and
// renamed (Put) or hard-linked (PutNew, which fails if the name exists) to
// its name, and the directory is fsynced: after a crash an object is
// either whole or absent.
type Dir struct {
	root string
}

// NewDir returns the Destination in directory root.
func NewDir(root string) *Dir { return &Dir{root: filepath.Clean(root)} }

// String implements Destination.
func (d *Dir) String() string { return "file://" + filepath.ToSlash(d.root) }

// CheckWritable makes the directory if it is missing and writes and
// removes a probe file in it: a directory the process may read but not
// write (its owner another user, a read-only mount) is found at start,
// not when the first run is due to leave hot state. It is the only call
// that makes the directory: Put and PutNew make the directories of
// objects under it, never it, so that an archive whose directory went
// away (a volume unmounted, the directory moved) takes no write until it
// is back, instead of one in a new directory nobody reads.
func (d *Dir) CheckWritable() error {
	if err := os.MkdirAll(d.root, 0o750); err != nil {
		return newError(CodeUnavailable, err, "write to %s", d)
	}
	f, err := os.CreateTemp(d.root, ".probe-*")
	if err != nil {
		return newError(CodeUnavailable, err, "write to %s", d)
	}
	name := f.Name()
	err = f.Close()
	if rerr := os.Remove(name); err == nil {
		err = rerr
	}
	if err != nil {
		return newError(CodeUnavailable, err, "write to %s", d)
	}
	return nil
}

// path maps an object name to a file path, refusing names that leave root.
func (d *Dir) path(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	return filepath.Join(d.root, filepath.FromSlash(name)), nil
}

// checkName refuses an object name that is not a clean relative
// slash-separated path ("", "../x", "/abs", "dir/", "a//b"): every
// Destination takes the same names.
func checkName(name string) error {
	clean := path.Clean("/" + name)
	if name == "" || clean != "/"+name || strings.HasSuffix(name, "/") {
		return newError(CodeInputInvalid, nil, "object name %q", name)
	}
	return nil
}

// Put implements Destination.
func (d *Dir) Put(ctx context.Context, name string, data []byte) error {
	return d.put(ctx, name, data, false)
}

// PutNew implements Destination.
func (d *Dir) PutNew(ctx context.Context, name string, data []byte) error {
	return d.put(ctx, name, data, true)
}

func (d *Dir) put(ctx context.Context, name string, data []byte, exclusive bool) error {
	if err := ctx.Err(); err != nil {
		return newError(CodeUnavailable, err, "put %s", name)
	}
	p, err := d.path(name)
	if err != nil {
		return err
	}
	dir := filepath.Dir(p)
	if err := d.mkdirsUnder(path.Dir(name)); err != nil {
		return newError(CodeUnavailable, err, "put %s", name)
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return newError(CodeUnavailable, err, "put %s", name)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return newError(CodeUnavailable, err, "put %s", name)
	}
	if exclusive {
		if err := os.Link(tmp.Name(), p); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return newError(CodeConflict, nil, "%s exists", name)
			}
			return newError(CodeUnavailable, err, "put %s", name)
		}
	} else if err := os.Rename(tmp.Name(), p); err != nil {
		return newError(CodeUnavailable, err, "put %s", name)
	}
	if err := syncDir(dir); err != nil {
		return newError(CodeUnavailable, err, "put %s", name)
	}
	return nil
}

// mkdirsUnder makes the directories of rel (a clean slash-separated path,
// "." for none) under the root, one by one, never the root: a root that
// is missing fails it.
func (d *Dir) mkdirsUnder(rel string) error {
	if rel == "." {
		return d.checkRoot()
	}
	at := d.root
	for _, part := range strings.Split(rel, "/") {
		at = filepath.Join(at, part)
		err := os.Mkdir(at, 0o750)
		if errors.Is(err, fs.ErrNotExist) && filepath.Dir(at) == d.root {
			return d.checkRoot()
		}
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkRoot returns an error matching ErrUnavailable when the directory
// does not exist or is not a directory. A writer makes it with its first
// object; a reader finds nothing there.
func (d *Dir) checkRoot() error {
	fi, err := os.Stat(d.root)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return newError(CodeUnavailable, nil, "directory %s does not exist", d.root)
	case err != nil:
		return newError(CodeUnavailable, err, "directory %s", d.root)
	case !fi.IsDir():
		return newError(CodeUnavailable, nil, "%s is not a directory", d.root)
	}
	return nil
}

// Get implements Destination.
func (d *Dir) Get(ctx context.Context, name string, limit int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, newError(CodeUnavailable, err, "get %s", name)
	}
	p, err := d.path(name)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, newError(CodeObjectNotFound, nil, "%s", name)
	}
	if err != nil {
		return nil, newError(CodeUnavailable, err, "get %s", name)
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return nil, newError(CodeUnavailable, err, "get %s", name)
	case !fi.Mode().IsRegular():
		// Not proof of damage: a directory in its place, a device.
		return nil, newError(CodeUnavailable, nil, "get %s: %s is not a regular file", name, p)
	case fi.Size() > limit:
		return nil, tooLarge(name, fi.Size(), limit)
	}
	b, err := readAtMost(f, limit)
	if err != nil {
		if errors.Is(err, ErrCorrupt) {
			return nil, newError(CodeCorrupt, err, "get %s", name)
		}
		return nil, newError(CodeUnavailable, err, "get %s", name)
	}
	return b, nil
}

// List implements Destination. Temporary files of unfinished writes are
// not listed.
func (d *Dir) List(ctx context.Context, prefix string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, newError(CodeUnavailable, err, "list %s", prefix)
	}
	var names []string
	// Walk only the directory the prefix is in.
	start := filepath.Join(d.root, filepath.FromSlash(path.Dir("/"+prefix+"x")))
	err := filepath.WalkDir(start, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if p == start && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		if e.IsDir() || strings.HasPrefix(e.Name(), ".tmp-") {
			return nil
		}
		rel, err := filepath.Rel(d.root, p)
		if err != nil {
			return err
		}
		if name := filepath.ToSlash(rel); strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
		return nil
	})
	if err != nil {
		return nil, newError(CodeUnavailable, err, "list %s", prefix)
	}
	slices.Sort(names)
	return names, nil
}
