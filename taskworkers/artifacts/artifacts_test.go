package artifacts_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/taskworkers/artifacts"
)

// startJS starts an embedded NATS server with JetStream for one test.
func startJS(t testing.TB) (*natsstore.Embedded, jetstream.JetStream) {
	t.Helper()
	js, srv := natstest.Start(t)
	return srv, js
}

func openStore(t testing.TB, opts artifacts.Options) (*natsstore.Embedded, *artifacts.Store) {
	t.Helper()
	srv, js := startJS(t)
	opts.Logger = zaptest.NewLogger(t)
	s, err := artifacts.Open(context.Background(), js, opts)
	if err != nil {
		t.Fatal(err)
	}
	return srv, s
}

func key(run, step string) artifacts.Key {
	return artifacts.Key{RunID: run, StepID: step, LogicalAttemptID: 1, EngineAttemptID: 1, Name: "stdout"}
}

func readAll(t *testing.T, s *artifacts.Store, uri string) ([]byte, statestore.ArtifactRef) {
	t.Helper()
	rc, ref, err := s.Get(context.Background(), uri)
	if err != nil {
		t.Fatalf("get %s: %v", uri, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", uri, err)
	}
	return b, ref
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestStore_Put(t *testing.T) {
	srv, _ := startJS(t)
	var violations atomic.Int32
	nc, err := srv.Connect(nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			violations.Add(1)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := artifacts.Open(context.Background(), js, artifacts.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("OK", func(t *testing.T) {
		data := []byte("hello, artifacts\n")
		k := artifacts.Key{RunID: "run-1", StepID: "build", LogicalAttemptID: 1, EngineAttemptID: 2, Name: "stdout"}
		ref, err := s.Put(ctx, k, "stdout", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		want := statestore.ArtifactRef{URI: "nats-os://SIDECAR_ARTIFACTS/cnVuLTE/YnVpbGQ/1/2/stdout", Kind: "stdout",
			SHA256: sum(data), SizeBytes: int64(len(data))}
		if ref != want {
			t.Fatalf("got %+v want %+v", ref, want)
		}
		got, gref := readAll(t, s, ref.URI)
		if !bytes.Equal(got, data) || gref != want {
			t.Fatalf("got %q %+v want %q %+v", got, gref, data, want)
		}
	})
	t.Run("Empty", func(t *testing.T) {
		ref, err := s.Put(ctx, key("run-empty", "s"), "stderr", strings.NewReader(""))
		if err != nil {
			t.Fatal(err)
		}
		if ref.SizeBytes != 0 || ref.SHA256 != sum(nil) {
			t.Fatalf("got %+v", ref)
		}
		got, gref := readAll(t, s, ref.URI)
		if len(got) != 0 || gref.Kind != "stderr" || gref.SHA256 != sum(nil) {
			t.Fatalf("got %q %+v", got, gref)
		}
	})
	t.Run("Large", func(t *testing.T) {
		data := make([]byte, 3<<20+17) // many 128 KiB chunks
		rand.Read(data)
		ref, err := s.Put(ctx, key("run-large", "s"), "stdout", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if ref.SizeBytes != int64(len(data)) || ref.SHA256 != sum(data) {
			t.Fatalf("got %+v", ref)
		}
		got, _ := readAll(t, s, ref.URI)
		if !bytes.Equal(got, data) {
			t.Fatal("bytes differ")
		}
	})
	t.Run("UnsafeIDs", func(t *testing.T) {
		ids := []string{"a.b", "a/b", "a b", "*", ">", "a.*.>", "ü/日本", "..", "a=b?c#d%2F", "run\x00nul", "-"}
		uris := map[string]string{}
		for _, run := range ids {
			for _, step := range ids {
				data := []byte(run + "|" + step)
				ref, err := s.Put(ctx, key(run, step), "stdout", bytes.NewReader(data))
				if err != nil {
					t.Fatalf("put %q %q: %v", run, step, err)
				}
				if prev, dup := uris[ref.URI]; dup {
					t.Fatalf("%q|%q and %s share URI %s", run, step, prev, ref.URI)
				}
				uris[ref.URI] = run + "|" + step
				if _, _, err := artifacts.ParseURI(ref.URI); err != nil || strings.ContainsAny(ref.URI, " *>") {
					t.Fatalf("bad uri %q: %v", ref.URI, err)
				}
				got, _ := readAll(t, s, ref.URI)
				if !bytes.Equal(got, data) {
					t.Fatalf("got %q want %q", got, data)
				}
			}
		}
	})
	t.Run("TokenMatchesRunToken", func(t *testing.T) {
		for _, id := range []string{"run-1", "a.b>c", "ü 日本"} {
			name, err := key(id, "s").ObjectName()
			if err != nil {
				t.Fatal(err)
			}
			if tok, _, _ := strings.Cut(name, "/"); tok != natsstore.RunToken(id) {
				t.Errorf("got token %q want natsstore.RunToken %q", tok, natsstore.RunToken(id))
			}
		}
	})
	t.Run("RePutKeepsBoth", func(t *testing.T) {
		// The same try run twice (a redelivery after a crash): the second
		// put gets a name of its own, and the first reference still reads
		// its own bytes. Overwriting would need a purge of the old chunks,
		// which the sidecar's NATS user may not do: the server refuses it
		// (a permission violation) and the put waits out a timeout.
		k := key("run-reput", "s")
		first, err := s.Put(ctx, k, "stdout", strings.NewReader("first try"))
		if err != nil {
			t.Fatal(err)
		}
		second, err := s.Put(ctx, k, "stdout", strings.NewReader("second try, longer"))
		if err != nil {
			t.Fatal(err)
		}
		if first.URI == second.URI || !strings.HasPrefix(second.URI, first.URI+".") {
			t.Fatalf("first %s second %s: want a name of its own, the first's plus a suffix", first.URI, second.URI)
		}
		for _, c := range []struct {
			ref  statestore.ArtifactRef
			want string
		}{{first, "first try"}, {second, "second try, longer"}} {
			got, ref := readAll(t, s, c.ref.URI)
			if string(got) != c.want || ref.SHA256 != c.ref.SHA256 {
				t.Fatalf("%s: got %q %+v, want %q", c.ref.URI, got, ref, c.want)
			}
		}
		if v := violations.Load(); v != 0 {
			t.Fatalf("%d permission violations: the put tried what the sidecar's user may not do", v)
		}
	})
	t.Run("ReaderError", func(t *testing.T) {
		k := key("run-readerr", "s")
		r := io.MultiReader(strings.NewReader("partial"), iotestErrReader{})
		if _, err := s.Put(ctx, k, "stdout", r); !errors.Is(err, errBoom) {
			t.Fatalf("got %v want errBoom", err)
		}
		uri := s.URI(mustName(t, k))
		if _, _, err := s.Get(ctx, uri); !errors.Is(err, artifacts.ErrNotFound) {
			t.Fatalf("got %v want ErrNotFound: a failed put must store nothing", err)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for i := range 16 {
			wg.Go(func() {
				k := artifacts.Key{RunID: "run-conc", StepID: fmt.Sprint("s", i), LogicalAttemptID: 1, EngineAttemptID: 1, Name: "stdout"}
				data := bytes.Repeat([]byte{byte(i)}, 200<<10)
				ref, err := s.Put(ctx, k, "stdout", bytes.NewReader(data))
				if err == nil && ref.SHA256 != sum(data) {
					err = fmt.Errorf("step %d: sha mismatch", i)
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})
}

type iotestErrReader struct{}

var errBoom = errors.New("boom")

func (iotestErrReader) Read([]byte) (int, error) { return 0, errBoom }

func mustName(t *testing.T, k artifacts.Key) string {
	t.Helper()
	n, err := k.ObjectName()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestKey_ObjectName(t *testing.T) {
	ok := key("r", "s")
	cases := []struct {
		name string
		mod  func(k *artifacts.Key)
	}{
		{"EmptyRun", func(k *artifacts.Key) { k.RunID = "" }},
		{"EmptyStep", func(k *artifacts.Key) { k.StepID = "" }},
		{"ZeroLogical", func(k *artifacts.Key) { k.LogicalAttemptID = 0 }},
		{"NegativeEngine", func(k *artifacts.Key) { k.EngineAttemptID = -1 }},
		{"EmptyName", func(k *artifacts.Key) { k.Name = "" }},
		{"SlashName", func(k *artifacts.Key) { k.Name = "a/b" }},
		{"DotDotName", func(k *artifacts.Key) { k.Name = ".." }},
		{"LongName", func(k *artifacts.Key) { k.Name = strings.Repeat("a", 65) }},
		{"HugeRunID", func(k *artifacts.Key) { k.RunID = strings.Repeat("r", 2000) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := ok
			tc.mod(&k)
			if _, err := k.ObjectName(); !errors.Is(err, artifacts.ErrInvalidKey) {
				t.Fatalf("got %v want ErrInvalidKey", err)
			}
		})
	}
	t.Run("OK", func(t *testing.T) {
		k := artifacts.Key{RunID: "r", StepID: "s", LogicalAttemptID: 3, EngineAttemptID: 12, Name: "http-response"}
		if got := mustName(t, k); got != "cg/cw/3/12/http-response" {
			t.Fatalf("got %q", got)
		}
	})
}

func TestStore_PutInvalid(t *testing.T) {
	_, s := openStore(t, artifacts.Options{})
	for _, kind := range []string{"", "has space", "new\nline", strings.Repeat("k", 65)} {
		if _, err := s.Put(context.Background(), key("r", "s"), kind, strings.NewReader("x")); !errors.Is(err, artifacts.ErrInvalidKey) {
			t.Errorf("kind %q: got %v want ErrInvalidKey", kind, err)
		}
	}
	if _, err := s.Put(context.Background(), artifacts.Key{}, "stdout", strings.NewReader("x")); !errors.Is(err, artifacts.ErrInvalidKey) {
		t.Errorf("empty key: got %v want ErrInvalidKey", err)
	}
}

func TestStore_Get(t *testing.T) {
	_, s := openStore(t, artifacts.Options{Bucket: "ART_TEST"})
	ctx := context.Background()
	ref, err := s.Put(ctx, key("r", "s"), "stdout", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref.URI, "nats-os://ART_TEST/") {
		t.Fatalf("got uri %s", ref.URI)
	}
	cases := []struct {
		name string
		uri  string
		want error
	}{
		{"NotFound", "nats-os://ART_TEST/cg/cw/1/1/stderr", artifacts.ErrNotFound},
		{"WrongScheme", "s3://ART_TEST/cg/cw/1/1/stdout", artifacts.ErrInvalidURI},
		{"NoObject", "nats-os://ART_TEST/", artifacts.ErrInvalidURI},
		{"NoBucket", "nats-os:///x", artifacts.ErrInvalidURI},
		{"OtherBucket", "nats-os://SIDECAR_ARTIFACTS/cg/cw/1/1/stdout", artifacts.ErrInvalidURI},
		{"Empty", "", artifacts.ErrInvalidURI},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc, _, err := s.Get(ctx, tc.uri)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v want %v", err, tc.want)
			}
			if rc != nil {
				t.Fatal("got a reader on error")
			}
		})
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	t.Run("BindsExisting", func(t *testing.T) {
		_, js := startJS(t)
		a, err := artifacts.Open(ctx, js, artifacts.Options{TTL: time.Hour, Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		ref, err := a.Put(ctx, key("r", "s"), "stdout", strings.NewReader("kept"))
		if err != nil {
			t.Fatal(err)
		}
		exp, err := time.Parse(time.RFC3339Nano, ref.ExpiresAt)
		if err != nil || time.Until(exp) < 59*time.Minute || time.Until(exp) > time.Hour {
			t.Fatalf("expiresAt %q: %v", ref.ExpiresAt, err)
		}
		// A second Open (another replica, other options) binds the bucket as
		// it is: data and TTL survive.
		b, err := artifacts.Open(ctx, js, artifacts.Options{Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		got, gref := readAll(t, b, ref.URI)
		if string(got) != "kept" || gref.ExpiresAt == "" {
			t.Fatalf("got %q %+v", got, gref)
		}
	})
	t.Run("BadBucket", func(t *testing.T) {
		_, js := startJS(t)
		if _, err := artifacts.Open(ctx, js, artifacts.Options{Bucket: "bad.bucket name"}); err == nil {
			t.Fatal("want an error for an invalid bucket name")
		}
	})
	t.Run("ServerDown", func(t *testing.T) {
		srv, s := openStore(t, artifacts.Options{})
		srv.Shutdown()
		srv.WaitForShutdown()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := s.Put(ctx, key("r", "s"), "stdout", strings.NewReader("x")); err == nil || errors.Is(err, artifacts.ErrInvalidKey) {
			t.Fatalf("got %v, want a store error", err)
		}
	})
}

func BenchmarkStore_Put(b *testing.B) {
	_, s := openStore(b, artifacts.Options{})
	ctx := context.Background()
	for _, size := range []int{0, 4 << 10, 1 << 20} {
		data := make([]byte, size)
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			i := 0
			for b.Loop() {
				i++
				k := artifacts.Key{RunID: "bench", StepID: "s", LogicalAttemptID: 1, EngineAttemptID: int64(i), Name: "stdout"}
				if _, err := s.Put(ctx, k, "stdout", bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
