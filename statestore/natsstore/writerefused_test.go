package natsstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/conductor-sidecar/sidecar/errcode"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
)

// envWriteRefusedChild makes the test binary the child of
// TestStore_WriteRefusedFailsFast, with the data dir as its value.
const envWriteRefusedChild = "NATSSTORE_WRITE_REFUSED_CHILD_DIR"

// TestStore_WriteRefusedFailsFast re-executes the test binary as a child
// whose files may not grow past natstest.WriteErrLimit, so that its
// embedded server's file stores fail writes for real. A stream in that
// state never answers a write; the child checks that the store's writes
// to it (a bucket's Create, as a start records its run request; an
// Append) answer STORE_WRITE_REFUSED, naming the stream and its error,
// instead of waiting out their timeout each.
func TestStore_WriteRefusedFailsFast(t *testing.T) {
	natstest.RunWriteErrChild(t, "TestStore_WriteRefusedChild", envWriteRefusedChild, "refused: ")
}

// TestStore_WriteRefusedChild is the child of
// TestStore_WriteRefusedFailsFast.
func TestStore_WriteRefusedChild(t *testing.T) {
	ctx := context.Background()
	// The writes below pass contexts without a deadline: each waits its
	// connection's timeout at most.
	js, srv, logs := natstest.StartWriteErrChild(t, envWriteRefusedChild)
	s, err := natsstore.Open(ctx, js, natsstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	runs, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "SIDECAR_RUNS"})
	if err != nil {
		t.Fatal(err)
	}
	// Filled through the bucket as JetStream gives it, not as OpenBucket
	// does: nothing of the store has seen the write error yet.
	raw, err := js.KeyValue(ctx, "SIDECAR_RUNS")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server: %s", natstest.FillUntilWriteError(t, raw, logs))

	// timedOut reports whether err says the write waited out a deadline.
	timedOut := func(err error) bool {
		return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
	}
	requireRefused := func(t *testing.T, what string, err error, stream string) {
		t.Helper()
		t.Logf("%s refused: %v", what, err)
		if !errors.Is(err, natsstore.ErrWriteRefused) || !errors.Is(err, errcode.Unavailable) {
			t.Fatalf("%s = %v, want STORE_WRITE_REFUSED", what, err)
		}
		for _, want := range []string{stream, "file too large", "restart serve"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s = %q, want it to name %q", what, err, want)
			}
		}
	}

	t.Run("BucketFastAfterATimeout", func(t *testing.T) {
		// Nothing has asked the server yet: the first write waits out its
		// timeout, then finds why.
		_, err := runs.Create(ctx, "req.first", []byte("{}"))
		requireRefused(t, "first create", err, "KV_SIDECAR_RUNS")
		if !timedOut(err) {
			t.Errorf("first create = %v, want the timeout it waited out in its tree", err)
		}
		// The next write knows without waiting.
		_, err = runs.Create(ctx, "req.second", []byte("{}"))
		requireRefused(t, "second create", err, "KV_SIDECAR_RUNS")
		if timedOut(err) {
			t.Fatalf("second create = %v, want it refused before its timeout", err)
		}
		_, err = runs.Put(ctx, "req.third", []byte("{}"))
		requireRefused(t, "put", err, "KV_SIDECAR_RUNS")
		if timedOut(err) {
			t.Fatalf("put = %v, want it refused before its timeout", err)
		}
	})

	t.Run("AppendFastAfterCheck", func(t *testing.T) {
		// The event stream fails a write of raw publishes, which pass the
		// store by; Check (what /readyz calls) finds it.
		t.Logf("server: %s", natstest.FillStreamUntilWriteError(t, natsstore.DefaultStream, logs, func(ctx context.Context, i int, val []byte) {
			subj := natsstore.EventSubject(natsstore.DefaultSubjectPrefix, fmt.Sprintf("filler-%d", i), strings.Repeat("a", 64))
			_, _ = js.Publish(ctx, subj, val)
		}))
		if err := srv.Check(); err == nil {
			t.Fatal("Check = nil with two streams that refuse every write")
		}
		_, err := s.Append(ctx, storetest.Event("run-refused", statestore.RunStarted, ""))
		requireRefused(t, "append", err, natsstore.DefaultStream)
		if !errors.Is(err, statestore.ErrUnavailable) {
			t.Errorf("append = %v, want it to match STORE_UNAVAILABLE too (the event may be appended again)", err)
		}
		if timedOut(err) {
			t.Fatalf("append = %v, want it refused before its timeout", err)
		}
	})

	t.Run("OtherStreamsStillWrite", func(t *testing.T) {
		other, err := natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: "SIDECAR_OTHER"})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // a safety net on a loaded machine
		defer cancel()
		if _, err := other.Put(wctx, "k", []byte("v")); err != nil {
			t.Fatalf("put to a stream without a write error: %v", err)
		}
	})
}
