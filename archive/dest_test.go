package archive_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/errcode"
)

func TestParseURL(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		url  string
		want string // String() of the destination; "" for ErrURLInvalid
	}{
		{"file://" + dir, "file://" + dir},
		{"file://localhost" + dir + "/", "file://" + dir},
		{"file://host" + dir, ""},
		{"file:relative/dir", ""},
		{"file://" + dir + "?x=1", ""},
		{"gopher://x/y", ""},
		{"/plain/path", ""},
		{"::", ""},
	} {
		d, err := archive.ParseURL(tc.url)
		switch {
		case tc.want == "" && (!errors.Is(err, archive.ErrURLInvalid) || !errors.Is(err, errcode.Invalid)):
			t.Errorf("ParseURL(%q): got %v, want ErrURLInvalid", tc.url, err)
		case tc.want != "" && err != nil:
			t.Errorf("ParseURL(%q): got %v", tc.url, err)
		case tc.want != "" && d.String() != tc.want:
			t.Errorf("ParseURL(%q): got %s, want %s", tc.url, d, tc.want)
		}
	}
}

func TestDir_Names(t *testing.T) {
	ctx := context.Background()
	d := archive.NewDir(filepath.Join(t.TempDir(), "a"))
	for _, name := range []string{"", "../x", "a/../../x", "/abs", "dir/", "a//b"} {
		if err := d.Put(ctx, name, []byte("x")); !errors.Is(err, archive.ErrInputInvalid) {
			t.Errorf("Put(%q): got %v, want ErrInputInvalid", name, err)
		}
		if _, err := d.Get(ctx, name); !errors.Is(err, archive.ErrInputInvalid) {
			t.Errorf("Get(%q): got %v, want ErrInputInvalid", name, err)
		}
	}
	if _, err := d.Get(ctx, "manifests/none.json"); !errors.Is(err, archive.ErrObjectNotFound) {
		t.Fatalf("got %v, want ErrObjectNotFound", err)
	}
	if err := d.PutNew(ctx, "m/1", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := d.PutNew(ctx, "m/1", []byte("b")); !errors.Is(err, archive.ErrConflict) {
		t.Fatalf("second PutNew: got %v, want ErrConflict", err)
	}
	if b, _ := d.Get(ctx, "m/1"); string(b) != "a" {
		t.Fatalf("got %q, want the first write", b)
	}
}

// failing is a Destination over a Dir whose calls fail when their func
// field says so.
type failing struct {
	*archive.Dir
	put    func(name string) error
	putNew func(name string) error
	get    func(name string, b []byte) ([]byte, error)
}

func (f *failing) Put(ctx context.Context, name string, data []byte) error {
	if f.put != nil {
		if err := f.put(name); err != nil {
			return err
		}
	}
	return f.Dir.Put(ctx, name, data)
}

func (f *failing) PutNew(ctx context.Context, name string, data []byte) error {
	if f.putNew != nil {
		if err := f.putNew(name); err != nil {
			return err
		}
	}
	return f.Dir.PutNew(ctx, name, data)
}

func (f *failing) Get(ctx context.Context, name string) ([]byte, error) {
	b, err := f.Dir.Get(ctx, name)
	if f.get != nil && err == nil {
		return f.get(name, b)
	}
	return b, err
}

func TestArchive_WriteDestinationFails(t *testing.T) {
	ctx := context.Background()
	down := &archive.Error{Code: archive.CodeUnavailable, Message: "connection refused"}
	for _, tc := range []struct {
		name string
		dest func(d *archive.Dir) *failing
		want error
	}{
		{"SegmentPutFails", func(d *archive.Dir) *failing {
			return &failing{Dir: d, put: func(string) error { return down }}
		}, archive.ErrUnavailable},
		{"ManifestPutFails", func(d *archive.Dir) *failing {
			return &failing{Dir: d, putNew: func(string) error { return down }}
		}, archive.ErrUnavailable},
		{"SegmentReadsBackDifferent", func(d *archive.Dir) *failing {
			return &failing{Dir: d, get: func(name string, b []byte) ([]byte, error) {
				if filepath.Dir(name) == "segments" {
					b = append([]byte(nil), b...)
					b[len(b)/2] ^= 1
				}
				return b, nil
			}}
		}, archive.ErrCorrupt},
		{"ManifestReadsBackDifferent", func(d *archive.Dir) *failing {
			return &failing{Dir: d, get: func(name string, b []byte) ([]byte, error) {
				if filepath.Dir(name) == "manifests" {
					return append([]byte(nil), b[:len(b)-1]...), nil
				}
				return b, nil
			}}
		}, archive.ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := openDir(t)
			a := mustOpen(t, tc.dest(dir))
			_, err := a.Write(ctx, finishedRuns(t, "r", 1))
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if h := a.Head(); h != nil {
				t.Fatalf("head moved to %d after a failed write", h.Seq)
			}
		})
	}
}
