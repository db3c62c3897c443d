package archive_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/conductor-sidecar/sidecar/archive"
	"github.com/conductor-sidecar/sidecar/archive/archivetest"
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
		{"file://" + dir + "/arch%00B", ""},
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

// destinations returns the Destinations every contract test runs against,
// each by a func that makes a new, empty one: a directory always, and a
// prefix of a bucket on the real S3-compatible server when
// SIDECAR_TEST_S3SERVER names it (required under CI=true).
func destinations(t *testing.T) map[string]func(t *testing.T) archive.Destination {
	t.Helper()
	dests := map[string]func(t *testing.T) archive.Destination{
		"Dir": func(t *testing.T) archive.Destination { d, _ := openDir(t); return d },
	}
	if os.Getenv(archivetest.EnvBinary) == "" && os.Getenv("CI") != "true" {
		t.Logf("%s not set: S3 destination not tested (deploy/local/s3server.sh builds the server)", archivetest.EnvBinary)
		return dests
	}
	srv := archivetest.StartS3(t)
	n := 0
	dests["S3"] = func(t *testing.T) archive.Destination {
		n++
		return srv.Bucket(fmt.Sprintf("contract-%d", n), "archive/a")
	}
	return dests
}

// TestDestination_Contract checks every Destination against the contract
// of dest.go: names, Put, PutNew (one winner of a race), Get, List.
func TestDestination_Contract(t *testing.T) {
	for name, newDest := range destinations(t) {
		t.Run(name, func(t *testing.T) { testDestinationContract(t, newDest) })
	}
}

func testDestinationContract(t *testing.T, newDest func(t *testing.T) archive.Destination) {
	ctx := context.Background()
	t.Run("Names", func(t *testing.T) {
		d := newDest(t)
		for _, name := range []string{"", "../x", "a/../../x", "/abs", "dir/", "a//b", "./a"} {
			if err := d.Put(ctx, name, []byte("x")); !errors.Is(err, archive.ErrInputInvalid) {
				t.Errorf("Put(%q): got %v, want ErrInputInvalid", name, err)
			}
			if err := d.PutNew(ctx, name, []byte("x")); !errors.Is(err, archive.ErrInputInvalid) {
				t.Errorf("PutNew(%q): got %v, want ErrInputInvalid", name, err)
			}
			if _, err := d.Get(ctx, name, 1<<20); !errors.Is(err, archive.ErrInputInvalid) {
				t.Errorf("Get(%q): got %v, want ErrInputInvalid", name, err)
			}
		}
		if names, err := d.List(ctx, ""); err != nil || len(names) != 0 {
			t.Fatalf("List after refused writes: got %v, %v, want nothing", names, err)
		}
	})
	t.Run("ErrObjectNotFound", func(t *testing.T) {
		d := newDest(t)
		_, err := d.Get(ctx, "manifests/none.json", 1<<20)
		if !errors.Is(err, archive.ErrObjectNotFound) || !errors.Is(err, errcode.NotFound) {
			t.Fatalf("got %v, want ErrObjectNotFound", err)
		}
	})
	t.Run("PutGet", func(t *testing.T) {
		d := newDest(t)
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
		for _, data := range [][]byte{{}, []byte("a"), big} {
			if err := d.Put(ctx, "segments/x.ndjson.gz", data); err != nil {
				t.Fatal(err)
			}
			got, err := d.Get(ctx, "segments/x.ndjson.gz", 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("got %d bytes back, want the %d written", len(got), len(data))
			}
		}
	})
	t.Run("PutNew", func(t *testing.T) {
		d := newDest(t)
		if err := d.PutNew(ctx, "m/1", []byte("a")); err != nil {
			t.Fatal(err)
		}
		if err := d.PutNew(ctx, "m/1", []byte("b")); !errors.Is(err, archive.ErrConflict) || !errors.Is(err, errcode.Conflict) {
			t.Fatalf("second PutNew: got %v, want ErrConflict", err)
		}
		if err := d.Put(ctx, "m/2", []byte("c")); err != nil {
			t.Fatal(err)
		}
		if err := d.PutNew(ctx, "m/2", []byte("d")); !errors.Is(err, archive.ErrConflict) {
			t.Fatalf("PutNew over Put: got %v, want ErrConflict", err)
		}
		for name, want := range map[string]string{"m/1": "a", "m/2": "c"} {
			if b, err := d.Get(ctx, name, 1<<20); err != nil || string(b) != want {
				t.Fatalf("%s: got %q, %v, want %q (the first write)", name, b, err, want)
			}
		}
	})
	t.Run("PutNewRace", func(t *testing.T) {
		d := newDest(t)
		const writers = 16
		for round := range 3 {
			name := fmt.Sprintf("manifests/%012d.json", round+1)
			var wg sync.WaitGroup
			errs := make([]error, writers)
			start := make(chan struct{})
			for i := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					errs[i] = d.PutNew(ctx, name, []byte(fmt.Sprintf("writer %d", i)))
				}()
			}
			close(start)
			wg.Wait()
			winner := -1
			for i, err := range errs {
				switch {
				case err == nil && winner >= 0:
					t.Fatalf("round %d: writers %d and %d both won", round, winner, i)
				case err == nil:
					winner = i
				case !errors.Is(err, archive.ErrConflict):
					t.Fatalf("round %d: writer %d: got %v, want ErrConflict", round, i, err)
				}
			}
			if winner < 0 {
				t.Fatalf("round %d: no writer won", round)
			}
			if b, err := d.Get(ctx, name, 1<<20); err != nil || string(b) != fmt.Sprintf("writer %d", winner) {
				t.Fatalf("round %d: got %q, %v, want the winner's (%d) bytes", round, b, err, winner)
			}
		}
	})
	t.Run("List", func(t *testing.T) {
		d := newDest(t)
		if names, err := d.List(ctx, "manifests/"); err != nil || len(names) != 0 {
			t.Fatalf("List of an empty destination: got %v, %v", names, err)
		}
		for _, name := range []string{"segments/2.gz", "manifests/000000000002.json", "segments/1.gz", "manifests/000000000001.json", "x/y/z"} {
			if err := d.Put(ctx, name, []byte(name)); err != nil {
				t.Fatal(err)
			}
		}
		for prefix, want := range map[string][]string{
			"manifests/": {"manifests/000000000001.json", "manifests/000000000002.json"},
			"segments/":  {"segments/1.gz", "segments/2.gz"},
			"x/":         {"x/y/z"},
			"none/":      nil,
			"":           {"manifests/000000000001.json", "manifests/000000000002.json", "segments/1.gz", "segments/2.gz", "x/y/z"},
		} {
			got, err := d.List(ctx, prefix)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("List(%q): got %v, want %v", prefix, got, want)
			}
		}
	})
	t.Run("CancelledContext", func(t *testing.T) {
		d := newDest(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := d.Put(cctx, "a", []byte("x")); !errors.Is(err, archive.ErrUnavailable) {
			t.Errorf("Put: got %v, want ErrUnavailable", err)
		}
		if err := d.PutNew(cctx, "a", []byte("x")); !errors.Is(err, archive.ErrUnavailable) {
			t.Errorf("PutNew: got %v, want ErrUnavailable", err)
		}
		if _, err := d.Get(cctx, "a", 1<<20); !errors.Is(err, archive.ErrUnavailable) {
			t.Errorf("Get: got %v, want ErrUnavailable", err)
		}
		if _, err := d.List(cctx, ""); !errors.Is(err, archive.ErrUnavailable) {
			t.Errorf("List: got %v, want ErrUnavailable", err)
		}
	})
	t.Run("ConcurrentWritersOneChain", func(t *testing.T) {
		d := newDest(t)
		runs := finishedRuns(t, "r", 16)
		writers := []*archive.Archive{mustOpen(t, d), mustOpen(t, d), mustOpen(t, d), mustOpen(t, d)}
		var wg sync.WaitGroup
		errs := make(chan error, len(runs))
		for i, r := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := writers[i%len(writers)].Write(ctx, []archive.Run{r})
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		rep := mustVerify(t, d, archive.VerifyOptions{})
		if len(rep.Problems) != 0 || rep.Manifests != 16 || rep.Runs != 16 || len(rep.Orphans) != 0 {
			t.Fatalf("got report %+v", rep)
		}
	})
	t.Run("ArchiveRoundTrip", func(t *testing.T) {
		d := newDest(t)
		runs := finishedRuns(t, "r", 3)
		a := mustOpen(t, d)
		for _, r := range runs {
			if _, err := a.Write(ctx, []archive.Run{r}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := mustOpen(t, d).Records(ctx, runs[1].ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, runs[1].Records) {
			t.Fatalf("got %+v, want %+v", got, runs[1].Records)
		}
		rep := mustVerify(t, d, archive.VerifyOptions{})
		if len(rep.Problems) != 0 || rep.Manifests != 3 || rep.Runs != 3 {
			t.Fatalf("got report %+v", rep)
		}
	})
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

func (f *failing) Get(ctx context.Context, name string, limit int64) ([]byte, error) {
	b, err := f.Dir.Get(ctx, name, limit)
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

func TestParseS3URL(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	none := env()
	local := env("AWS_ENDPOINT_URL", "http://127.0.0.1:7070")
	for _, tc := range []struct {
		url    string
		getenv func(string) string
		want   *archive.S3Config // nil: ErrURLInvalid
	}{
		{"s3://bucket/prefix/sub/", none, &archive.S3Config{Bucket: "bucket", Prefix: "prefix/sub"}},
		{"s3://my.bucket-1", none, &archive.S3Config{Bucket: "my.bucket-1"}},
		{"s3://bucket/p", local, &archive.S3Config{Bucket: "bucket", Prefix: "p", Endpoint: "http://127.0.0.1:7070", PathStyle: true}},
		{"s3://bucket/p", env("AWS_ENDPOINT_URL", "http://a", "AWS_ENDPOINT_URL_S3", "http://b"), &archive.S3Config{Bucket: "bucket", Prefix: "p", Endpoint: "http://b", PathStyle: true}},
		{"s3://bucket/p", env("AWS_ENDPOINT_URL", "http://a", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"), &archive.S3Config{Bucket: "bucket", Prefix: "p"}},
		{"s3://bucket/p?path-style=false", local, &archive.S3Config{Bucket: "bucket", Prefix: "p", Endpoint: "http://127.0.0.1:7070"}},
		{"s3://bucket/p?path-style=true", none, &archive.S3Config{Bucket: "bucket", Prefix: "p", PathStyle: true}},
		{"s3://bucket/p?path-style=yes", none, nil},
		{"s3://bucket/p?region=x", none, nil},
		{"s3://key:secret@bucket/p", none, nil},
		{"s3://bucket:9000/p", none, nil},
		{"s3://Bucket/p", none, nil},
		{"s3://b/p", none, nil},
		{"s3:///p", none, nil},
		{"s3://bucket/a//b", none, nil},
		{"s3://bucket/a/../b", none, nil},
		{"s3://bucket/p#x", none, nil},
	} {
		got, err := archive.ParseS3URL(tc.url, tc.getenv)
		switch {
		case tc.want == nil && !errors.Is(err, archive.ErrURLInvalid):
			t.Errorf("ParseS3URL(%q): got %+v, %v, want ErrURLInvalid", tc.url, got, err)
		case tc.want != nil && err != nil:
			t.Errorf("ParseS3URL(%q): got %v", tc.url, err)
		case tc.want != nil && got != *tc.want:
			t.Errorf("ParseS3URL(%q): got %+v, want %+v", tc.url, got, *tc.want)
		}
	}
	t.Run("ParseURL", func(t *testing.T) {
		t.Setenv("AWS_REGION", "eu-west-1")
		d, err := archive.ParseURL("s3://bucket/a/b")
		if err != nil {
			t.Fatal(err)
		}
		if d.String() != "s3://bucket/a/b" {
			t.Fatalf("got %s", d)
		}
	})
}

// lostAnswer is a Destination over a Dir whose first PutNew stores the
// object and then answers ErrConflict, as a client does that retried a
// conditional PUT whose first answer was lost.
type lostAnswer struct {
	*archive.Dir
	lost bool
}

func (d *lostAnswer) PutNew(ctx context.Context, name string, data []byte) error {
	if err := d.Dir.PutNew(ctx, name, data); err != nil || d.lost {
		return err
	}
	d.lost = true
	return &archive.Error{Code: archive.CodeConflict, Message: name + " exists"}
}

// TestArchive_WriteLostAnswer checks that a manifest the destination
// stored but answered as a conflict (its own earlier attempt) counts as
// written, not as lost to another writer: the runs are not written a
// second time under the next seq.
func TestArchive_WriteLostAnswer(t *testing.T) {
	ctx := context.Background()
	dir, _ := openDir(t)
	d := &lostAnswer{Dir: dir}
	a := mustOpen(t, d)
	runs := finishedRuns(t, "r", 2)
	m, err := a.Write(ctx, runs[:1])
	if err != nil {
		t.Fatal(err)
	}
	if m.Seq != 1 {
		t.Fatalf("got manifest %d, want 1", m.Seq)
	}
	if m, err = a.Write(ctx, runs[1:]); err != nil || m.Seq != 2 {
		t.Fatalf("next write: got %v, %v, want manifest 2", m, err)
	}
	rep := mustVerify(t, d, archive.VerifyOptions{})
	if len(rep.Problems) != 0 || rep.Manifests != 2 || rep.Runs != 2 {
		t.Fatalf("got report %+v", rep)
	}
}

// TestDir_CheckWritable: a directory serve may write passes, made when
// missing, and keeps no probe; one it cannot write (under a regular
// file, or read-only to a user other than root) is ErrUnavailable.
func TestDir_CheckWritable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "archive")
	if err := archive.NewDir(dir).CheckWritable(); err != nil {
		t.Fatalf("a directory serve may write: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("the probe left %d files", len(left))
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := archive.NewDir(filepath.Join(file, "archive")).CheckWritable(); !errors.Is(err, archive.ErrUnavailable) {
		t.Fatalf("a directory under a regular file: %v, want ErrUnavailable", err)
	}
	if os.Geteuid() == 0 {
		return // root writes a read-only directory
	}
	ro := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(ro, 0o500); err != nil {
		t.Fatal(err)
	}
	if err := archive.NewDir(ro).CheckWritable(); !errors.Is(err, archive.ErrUnavailable) {
		t.Fatalf("a read-only directory: %v, want ErrUnavailable", err)
	}
}
