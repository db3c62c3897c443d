package eventbus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
	"github.com/conductor-sidecar/sidecar/vocab"
)

// benchLog is a log of n events (n/4 runs of four) on an embedded server.
func benchLog(b *testing.B, n int) (jetstream.JetStream, *natsstore.Store) {
	b.Helper()
	js, _ := natstest.StartIn(b, b.TempDir(), natsstore.EmbeddedConfig{
		Permissions: natsstore.Permissions(natsstore.DefaultSubjectPrefix, "bench.events.>", "raw.events.>"), SyncInterval: time.Minute})
	s, err := natsstore.Open(context.Background(), js, natsstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := w; r < n/4; r += 16 {
				id := fmt.Sprintf("bench-run-%d", r)
				for _, e := range []struct{ typ, step string }{{statestore.RunStarted, ""}, {statestore.StepStarted, "a"}, {statestore.StepCompleted, "a"}, {statestore.RunCompleted, ""}} {
					if _, err := s.Append(context.Background(), storetest.Event(id, e.typ, e.step)); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	return js, s
}

func drainBus(b *testing.B, js jetstream.JetStream, s *natsstore.Store, sink eventbus.Sink) time.Duration {
	b.Helper()
	ctx := context.Background()
	last, _ := s.LastSeq(ctx)
	began := time.Now()
	bus, err := eventbus.Open(ctx, js, eventbus.Options{Log: s, Sinks: []eventbus.Sink{sink}, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer bus.Close(context.Background())
	for {
		st, err := bus.Status(ctx)
		if err == nil && st[0].Cursor >= last {
			return time.Since(began)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkNATSSink: the rate at which the bus delivers a 20,000-event
// log to a NATS sink, against the raw limit: the same messages published
// with the same async JetStream publishes, ids and acknowledgement waits.
func BenchmarkNATSSink(b *testing.B) {
	const n = 20000
	js, s := benchLog(b, n)
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		sink, err := eventbus.OpenNATSSink(ctx, js, eventbus.NATSSinkConfig{Name: fmt.Sprintf("bench%d", i), Prefix: "bench", Stream: fmt.Sprintf("BENCH%d", i)})
		if err != nil {
			b.Fatal(err)
		}
		took := drainBus(b, js, s, sink)
		b.ReportMetric(float64(n)/took.Seconds(), "bus-events/s")
		// Raw: the same bodies on a fresh stream, 256 in flight at a time.
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: fmt.Sprintf("RAW%d", i), Subjects: []string{fmt.Sprintf("raw.events.%d.>", i)}}); err != nil {
			b.Fatal(err)
		}
		body := bytes.Repeat([]byte("x"), 500)
		began := time.Now()
		for j := 0; j < n; j += 256 {
			var fs []jetstream.PubAckFuture
			for k := j; k < min(j+256, n); k++ {
				m := &nats.Msg{Subject: fmt.Sprintf("raw.events.%d.t.p.RunStarted", i), Data: body, Header: nats.Header{}}
				m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%d-%d", i, k))
				f, err := js.PublishMsgAsync(m)
				if err != nil {
					b.Fatal(err)
				}
				fs = append(fs, f)
			}
			for _, f := range fs {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(n)/time.Since(began).Seconds(), "raw-publish/s")
	}
}

// BenchmarkWebhookSink: the rate at which the bus delivers a 4,000-event
// log to a webhook on loopback (one request and one cursor write per
// event), against the raw limit: the same signed requests in a bare loop.
func BenchmarkWebhookSink(b *testing.B) {
	const n = 4000
	js, s := benchLog(b, n)
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got.Add(1) }))
	defer srv.Close()
	secret := []byte("bench-secret-0123456789")
	for i := 0; i < b.N; i++ {
		sink, err := eventbus.NewWebhookSink(eventbus.WebhookSinkConfig{Name: fmt.Sprintf("hook%d", i), URL: srv.URL, Secret: secret})
		if err != nil {
			b.Fatal(err)
		}
		took := drainBus(b, js, s, sink)
		b.ReportMetric(float64(n)/took.Seconds(), "bus-events/s")
		raw, _ := eventbus.NewWebhookSink(eventbus.WebhookSinkConfig{Name: "raw", URL: srv.URL, Secret: secret})
		msg := []eventbus.Message{{ID: "x", Type: "RunStarted", Body: bytes.Repeat([]byte("x"), 500)}}
		began := time.Now()
		for range n {
			if _, err := raw.Deliver(context.Background(), msg); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(n)/time.Since(began).Seconds(), "raw-posts/s")
	}
}

// BenchmarkDeliveryLatency: the latency the bus adds, persistedAt to the
// webhook's receipt, with events appended one at a time at about 500/s.
func BenchmarkDeliveryLatency(b *testing.B) {
	js, s := benchLog(b, 0)
	var mu sync.Mutex
	var lat []time.Duration
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rec statestore.RunEventRecord
		buf := new(bytes.Buffer)
		_, _ = buf.ReadFrom(r.Body)
		if err := json.Unmarshal(buf.Bytes(), &rec); err == nil {
			if t, err := time.Parse(time.RFC3339Nano, rec.PersistedAt); err == nil {
				mu.Lock()
				lat = append(lat, time.Since(t))
				mu.Unlock()
			}
		}
	}))
	defer srv.Close()
	sink, _ := eventbus.NewWebhookSink(eventbus.WebhookSinkConfig{Name: "lat", Vocabulary: vocab.Sidecar, URL: srv.URL, Secret: []byte("bench-secret-0123456789")})
	bus, err := eventbus.Open(context.Background(), js, eventbus.Options{Log: s, Sinks: []eventbus.Sink{sink}, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer bus.Close(context.Background())
	const n = 2000
	for i := 0; i < b.N; i++ {
		mu.Lock()
		lat = lat[:0]
		mu.Unlock()
		for j := range n {
			if _, err := s.Append(context.Background(), storetest.Event(fmt.Sprintf("lat-%d-%d", i, j), statestore.RunStarted, "")); err != nil {
				b.Fatal(err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		for {
			mu.Lock()
			k := len(lat)
			mu.Unlock()
			if k >= n {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		mu.Lock()
		sort.Slice(lat, func(x, y int) bool { return lat[x] < lat[y] })
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		mu.Unlock()
	}
}
