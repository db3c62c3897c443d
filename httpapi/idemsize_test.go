package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/conductor-sidecar/sidecar/httpapi"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
)

// repliesBytes is what the replies' stream holds now.
func repliesBytes(t *testing.T, js jetstream.JetStream) jetstream.StreamInfo {
	t.Helper()
	st, err := js.Stream(context.Background(), "KV_"+httpapi.KVRepliesBucket)
	if err != nil {
		t.Fatal(err)
	}
	return *st.CachedInfo()
}

// TestKVReplies_BoundedBytes: kept answers never hold more than the
// bucket's bound, however many keys a caller sends; the newest answers
// still replay exactly, and a key whose answer was evicted (the oldest
// first) runs its action again, as a new key would.
func TestKVReplies_BoundedBytes(t *testing.T) {
	ctx := context.Background()
	js, _ := natstest.Start(t)
	const bound = 4 << 20
	replies, err := httpapi.OpenKVReplies(ctx, js, httpapi.KVRepliesOptions{TTL: time.Hour, MaxBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	e := newReplayEnvWith(t, replies, func(d time.Duration) { replies.StaleAfter = d })
	e.control.notice = strings.Repeat("n", 20<<10) // an answer of about 20 KiB
	const keys = 600                               // about 12 MiB of answers
	var last replyAnswer
	for i := range keys {
		last = e.post(t, "/v1/runs/run-1/pause", fmt.Sprintf("k-%d", i), `{"reason":"deploy"}`)
		if last.status != http.StatusOK || last.replayed {
			t.Fatalf("pause %d: %d %.200s", i, last.status, last.body)
		}
	}
	info := repliesBytes(t, js)
	if info.State.Bytes > bound {
		t.Fatalf("the replies' bucket holds %d bytes after %d keyed pauses of about 20 KiB, over its bound of %d", info.State.Bytes, keys, bound)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(replies.SizeCollector())
	if b, m := gaugeOf(t, reg, "sidecar_control_replies_bytes"), gaugeOf(t, reg, "sidecar_control_replies_max_bytes"); b <= 0 || b > bound || m != bound {
		t.Fatalf("sidecar_control_replies_bytes %v, _max_bytes %v; want (0, %d] and %d", b, m, bound, bound)
	}
	calls := e.control.calls.Load()
	again := e.post(t, "/v1/runs/run-1/pause", fmt.Sprintf("k-%d", keys-1), `{"reason":"deploy"}`)
	if again.status != last.status || again.body != last.body || !again.replayed {
		t.Fatalf("the newest key does not replay its answer: %d replayed=%v", again.status, again.replayed)
	}
	if n := e.control.calls.Load(); n != calls {
		t.Fatalf("the newest key's replay reached the control (%d calls, want %d)", n, calls)
	}
	evicted := e.post(t, "/v1/runs/run-1/pause", "k-0", `{"reason":"deploy"}`)
	if evicted.status != http.StatusOK || evicted.replayed {
		t.Fatalf("the oldest key, evicted: %d replayed=%v; want its action run again", evicted.status, evicted.replayed)
	}
	if n := e.control.calls.Load(); n != calls+1 {
		t.Fatalf("the oldest key reached the control %d times, want once more", n-calls)
	}
}

// gaugeOf is the value of reg's gauge name.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			return mf.Metric[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// TestKVReplies_AnExistingBucketKeepsItsBound: serve never updates a
// stream (its NATS user may not). A bucket made before the bound (the KV
// API's: no bound, discard new) is used as it is, its answers kept, with
// one warning that carries the command aligning it; a bucket with the
// configured bound opens without a word.
func TestKVReplies_AnExistingBucketKeepsItsBound(t *testing.T) {
	ctx := context.Background()
	open := func(js jetstream.JetStream, bound int64) []observer.LoggedEntry {
		t.Helper()
		core, logs := observer.New(zap.WarnLevel)
		if _, err := httpapi.OpenKVReplies(ctx, js, httpapi.KVRepliesOptions{TTL: time.Hour, MaxBytes: bound, Log: zap.New(core)}); err != nil {
			t.Fatal(err)
		}
		return logs.All()
	}
	js, _ := natstest.Start(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: httpapi.KVRepliesBucket, TTL: time.Hour, History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "kept", []byte("x")); err != nil {
		t.Fatal(err)
	}
	warns := open(js, 8<<20)
	fix := "nats stream edit KV_SIDECAR_CONTROL_REPLIES --max-bytes 8388608 --discard old"
	if len(warns) != 1 || warns[0].ContextMap()["fix"] != fix || !strings.Contains(warns[0].Message, "--control-replies-max-mib") {
		t.Fatalf("opening a bucket made without a bound: warnings %v, want one with fix %q", warns, fix)
	}
	if info := repliesBytes(t, js); info.Config.MaxBytes != -1 || info.Config.Discard != jetstream.DiscardNew {
		t.Fatalf("the existing bucket was changed: max bytes %d, discard %v", info.Config.MaxBytes, info.Config.Discard)
	}
	if e, err := kv.Get(ctx, "kept"); err != nil || string(e.Value()) != "x" {
		t.Fatalf("an entry of the existing bucket: %v", err)
	}

	js, _ = natstest.Start(t)
	if warns := open(js, 8<<20); len(warns) != 0 {
		t.Fatalf("creating the bucket: warnings %v", warns)
	}
	if warns := open(js, 8<<20); len(warns) != 0 {
		t.Fatalf("opening the bucket with its bound: warnings %v", warns)
	}
	if warns := open(js, 4<<20); len(warns) != 1 {
		t.Fatalf("opening the bucket with another bound: warnings %v, want one", warns)
	}
}
