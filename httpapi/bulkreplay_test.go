package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// TestIdempotencyKey_BulkOfMaxRunsIsReplayed: the answer of a bulk pause
// over MaxBulkRuns runs (about 1.2 MB of JSON with UUID run ids, more than
// a NATS message holds) is kept like any other: the same request again
// with the same Idempotency-Key gets the first answer replayed, byte for
// byte, and pauses nothing again (had it run again, every run would be
// already_paused).
func TestIdempotencyKey_BulkOfMaxRunsIsReplayed(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 runs")
	}
	for _, backend := range replyBackends {
		t.Run(backend, func(t *testing.T) {
			replies, _ := openReplies(t, backend)
			c := &startingControl{starts: func(string) []string { return nil }}
			store, list := openListedLog(t, natstest.Connect(t, natstestServer(t)))
			c.t, c.store = t, store
			srv := httptest.NewServer(httpapi.NewServer(httpapi.Options{Log: store, List: list, Control: c, Replies: replies, Logger: zaptest.NewLogger(t)}).Handler())
			t.Cleanup(srv.Close)
			ids := make(chan string)
			var wg sync.WaitGroup
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for id := range ids {
						c.start(id)
					}
				}()
			}
			for range httpapi.MaxBulkRuns {
				ids <- "run-" + uuid.NewString()
			}
			close(ids)
			wg.Wait()
			// The bulk action waits 10 s for the run list; under load it
			// may need longer to take in 10,000 runs.
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, err := list.WaitIndexed(wctx); err != nil {
				t.Fatal(err)
			}

			e := &replayEnv{srv: srv}
			body := `{"labelSelector":"team=data","reason":"incident"}`
			first := e.post(t, "/v1/runs:pause", "bulk-10k", body)
			want := fmt.Sprintf(`"counts":{"paused":%d}`, httpapi.MaxBulkRuns)
			if first.status != http.StatusOK || !strings.Contains(first.body, want) {
				t.Fatalf("first bulk pause: %d, %d bytes (%s...), want 200 with %s", first.status, len(first.body), first.body[:min(len(first.body), 200)], want)
			}
			if len(first.body) <= 1<<20 {
				t.Fatalf("the answer is %d bytes: the test needs one larger than a NATS message (1 MiB)", len(first.body))
			}
			again := e.post(t, "/v1/runs:pause", "bulk-10k", body)
			if again.status != first.status || !again.replayed || again.body != first.body {
				head := again.body[:min(len(again.body), 200)]
				t.Fatalf("the same bulk pause again: %d replayed=%v, %d bytes (%s...); want the first answer (%d bytes) replayed",
					again.status, again.replayed, len(again.body), head, len(first.body))
			}
		})
	}
}

// TestKVReplies_AnswerInParts: an answer larger than one entry is kept in
// parts and read back whole; when a part is gone (parts are written before
// the entry that names them, so they expire first) the key is taken over
// as an expired one, never answered with part of the answer.
func TestKVReplies_AnswerInParts(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	replies, err := httpapi.OpenKVReplies(ctx, js, httpapi.KVRepliesOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	replies.SetPartBytes(1 << 10)
	var body bytes.Buffer
	body.WriteString(`{"runs":[`)
	for i := range 2000 {
		fmt.Fprintf(&body, `{"runId":"run-%s","n":%d},`, uuid.NewString(), i)
	}
	body.WriteString(`{}]}`)
	if kept, err := replies.Claim(ctx, "k", "fp"); kept != nil || err != nil {
		t.Fatalf("first claim: %v %v", kept, err)
	}
	if err := replies.Keep(ctx, "k", "fp", &httpapi.Reply{Status: 200, Body: body.Bytes()}); err != nil {
		t.Fatal(err)
	}
	kept, err := replies.Claim(ctx, "k", "fp")
	if err != nil || kept == nil || kept.Status != 200 || !bytes.Equal(kept.Body, body.Bytes()) {
		t.Fatalf("the kept answer: %v, %d bytes of %d", err, len(keptBody(kept)), body.Len())
	}
	kv, err := js.KeyValue(ctx, httpapi.KVRepliesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "k.p2"); err != nil {
		t.Fatalf("the answer (%d bytes) is not in parts of 1 KiB: %v", body.Len(), err)
	}
	if err := kv.Delete(ctx, "k.p1"); err != nil {
		t.Fatal(err)
	}
	if kept, err := replies.Claim(ctx, "k", "fp"); kept != nil || err != nil {
		t.Fatalf("a claim of an answer with a part gone: %d bytes, %v; want it taken over (nil, nil)", len(keptBody(kept)), err)
	}
	if _, err := replies.Claim(ctx, "k", "fp"); !errors.Is(err, httpapi.ErrReplyPending) {
		t.Fatalf("the taken-over key: %v, want it claimed (ErrReplyPending)", err)
	}
	// A part that is not the one the entry names (a keep cut short, then
	// another): the same.
	if err := replies.Keep(ctx, "k", "fp", &httpapi.Reply{Status: 200, Body: body.Bytes()}); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k.p0", []byte("another keep's part")); err != nil {
		t.Fatal(err)
	}
	if kept, err := replies.Claim(ctx, "k", "fp"); kept != nil || err != nil {
		t.Fatalf("a claim of an answer with a foreign part: %d bytes, %v; want it taken over (nil, nil)", len(keptBody(kept)), err)
	}
}

func keptBody(r *httpapi.Reply) []byte {
	if r == nil {
		return nil
	}
	return r.Body
}
