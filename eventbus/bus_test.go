package eventbus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/conductor-sidecar/sidecar/eventbus"
	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore/natstest"
	"github.com/conductor-sidecar/sidecar/statestore/storetest"
	"github.com/conductor-sidecar/sidecar/vocab"
)

type fixture struct {
	t     *testing.T
	js    jetstream.JetStream
	store *natsstore.Store
}

func newFixture(t *testing.T) *fixture {
	// The sidecar's own least privilege, with the NATS sinks' subjects
	// as serve grants them.
	js, _ := natstest.StartIn(t, t.TempDir(), natsstore.EmbeddedConfig{
		Permissions: natsstore.Permissions(natsstore.DefaultSubjectPrefix, "acme.events.>", "acme-raw.events.>")})
	s, err := natsstore.Open(context.Background(), js, natsstore.Options{Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &fixture{t: t, js: js, store: s}
}

// runs appends n runs of RunStarted, StepStarted, StepCompleted,
// RunCompleted, interleaved, and returns the log in order.
func (f *fixture) runs(n int, tenant string) []statestore.RunEventRecord {
	f.t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("run-%s-%d-%d", tenant, i, time.Now().UnixNano())
	}
	var out []statestore.RunEventRecord
	for _, typ := range []struct{ typ, step string }{{statestore.RunStarted, ""}, {statestore.StepStarted, "a"}, {statestore.StepCompleted, "a"}, {statestore.RunCompleted, ""}} {
		for _, id := range ids {
			w := storetest.Event(id, typ.typ, typ.step)
			w.TenantID = tenant
			storetest.Rekey(w)
			res, err := f.store.Append(context.Background(), w)
			if err != nil {
				f.t.Fatal(err)
			}
			out = append(out, statestore.RunEventRecord{RunEventWrite: *w, RunSeq: res.RunSeq, PersistedAt: res.PersistedAt})
		}
	}
	return out
}

func (f *fixture) open(sinks []eventbus.Sink, opts eventbus.Options) *eventbus.Bus {
	f.t.Helper()
	opts.Log, opts.Sinks = f.store, sinks
	opts.Poll = 20 * time.Millisecond
	if opts.InitialInterval == 0 {
		opts.InitialInterval = 10 * time.Millisecond
		opts.MaxInterval = 50 * time.Millisecond
	}
	opts.Logger = zaptest.NewLogger(f.t)
	b, err := eventbus.Open(context.Background(), f.js, opts)
	if err != nil {
		f.t.Fatal(err)
	}
	return b
}

// hook is a webhook consumer: it verifies each request's signature and
// records the ids in arrival order; answer decides the status.
type hook struct {
	t      *testing.T
	secret []byte
	mu     sync.Mutex
	ids    []string
	bodies map[string][]byte
	calls  int
	answer func(id string, call int) int
}

func newHook(t *testing.T, answer func(id string, call int) int) (*hook, *httptest.Server) {
	h := &hook{t: t, secret: []byte("0123456789abcdef-secret"), bodies: map[string][]byte{}, answer: answer}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return h, srv
}

func (h *hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id, ts := r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp")
	if got, want := r.Header.Get("webhook-signature"), "v1,"+eventbus.Sign(h.secret, id, ts, body); got != want {
		h.t.Errorf("event %s: signature %q, want %q", id, got, want)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	h.mu.Lock()
	h.calls++
	code := http.StatusOK
	if h.answer != nil {
		code = h.answer(id, h.calls)
	}
	if code/100 == 2 {
		h.ids = append(h.ids, id)
		h.bodies[id] = body
	}
	h.mu.Unlock()
	w.WriteHeader(code)
}

func (h *hook) received() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.ids...)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ids(recs []statestore.RunEventRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.EventID
	}
	return out
}

// checkOrder fails unless got holds every id of want, first receipts in
// want's order.
func checkOrder(t *testing.T, got, want []string) {
	t.Helper()
	seen := map[string]bool{}
	var first []string
	for _, id := range got {
		if !seen[id] {
			seen[id] = true
			first = append(first, id)
		}
	}
	if strings.Join(first, ",") != strings.Join(want, ",") {
		t.Fatalf("received %d distinct events (of %d), not in the log's order or not all of them", len(first), len(want))
	}
}

func webhookSink(t *testing.T, name, vocabulary string, h *hook, srv *httptest.Server) eventbus.Sink {
	s, err := eventbus.NewWebhookSink(eventbus.WebhookSinkConfig{Name: name, Vocabulary: vocabulary, URL: srv.URL, Secret: h.secret, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBus_WebhookRetriesInOrder: every persisted event reaches the
// webhook once, signed, in the log's order, through failures that are
// retried with backoff (a 503 on every third call).
func TestBus_WebhookRetriesInOrder(t *testing.T) {
	f := newFixture(t)
	log := f.runs(10, "t1")
	h, srv := newHook(t, func(_ string, call int) int {
		if call%3 == 0 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	reg := prometheus.NewRegistry()
	b := f.open([]eventbus.Sink{webhookSink(t, "audit", vocab.Sidecar, h, srv)}, eventbus.Options{Metrics: eventbus.NewMetrics(reg)})
	defer b.Close(context.Background())
	waitFor(t, "every event", func() bool { return len(h.received()) >= len(log) })
	checkOrder(t, h.received(), ids(log))
	if got := len(h.received()); got != len(log) {
		t.Fatalf("%d deliveries of %d events: a retry repeated an acknowledged event", got, len(log))
	}
	var rec statestore.RunEventRecord
	if err := json.Unmarshal(h.bodies[log[0].EventID], &rec); err != nil || rec.RunSeq != log[0].RunSeq || rec.PersistedAt != log[0].PersistedAt {
		t.Fatalf("body of the first event: %+v %v, want the persisted record", rec, err)
	}
	if n := metric(t, reg, "sidecar_eventbus_delivery_failures_total", "audit"); n < 10 {
		t.Fatalf("%v failures counted, want about a third of %d calls", n, len(log))
	}
}

// metric is the value of the metric name{sink}.
func metric(t *testing.T, reg *prometheus.Registry, name, sink string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "sink" && l.GetValue() == sink {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// TestBus_DeadLetterAndReplay: an event the consumer refuses for good
// (400) is dead-lettered at once and the sink moves on; one that keeps
// failing (503) is dead-lettered after MaxAttempts. Both are kept, listed,
// and replayed once the consumer takes them, then removed.
func TestBus_DeadLetterAndReplay(t *testing.T) {
	f := newFixture(t)
	log := f.runs(3, "t1")
	refused, flaky := log[1].EventID, log[4].EventID
	var mu sync.Mutex
	fixed := false
	h, srv := newHook(t, func(id string, _ int) int {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case fixed:
			return http.StatusOK
		case id == refused:
			return http.StatusBadRequest
		case id == flaky:
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	reg := prometheus.NewRegistry()
	b := f.open([]eventbus.Sink{webhookSink(t, "audit", vocab.Sidecar, h, srv)}, eventbus.Options{MaxAttempts: 3, Metrics: eventbus.NewMetrics(reg)})
	defer b.Close(context.Background())
	waitFor(t, "every other event", func() bool { return len(h.received()) >= len(log)-2 })
	var want []string
	for _, id := range ids(log) {
		if id != refused && id != flaky {
			want = append(want, id)
		}
	}
	checkOrder(t, h.received(), want)
	if n := metric(t, reg, "sidecar_eventbus_dead_lettered_total", "audit"); n != 2 {
		t.Fatalf("%v dead-lettered, want 2", n)
	}
	if n := metric(t, reg, "sidecar_eventbus_delivery_failures_total", "audit"); n != 1+3 {
		t.Fatalf("%v failed attempts, want 1 (refused) + 3 (MaxAttempts)", n)
	}
	ctx := context.Background()
	dls, err := b.DeadLetters(ctx, "audit", "", 100, nil)
	if err != nil || len(dls) != 2 || dls[0].EventID != refused || dls[1].EventID != flaky || dls[0].Attempts != 1 || dls[1].Attempts != 3 {
		t.Fatalf("dead letters %+v %v, want the refused (1 attempt) then the flaky (3 attempts)", dls, err)
	}
	if !strings.Contains(dls[0].Error, "400") || dls[1].RunID != log[4].RunID || dls[1].LogSeq != uint64(log[4].RunSeq) || dls[1].Sink != "audit" {
		t.Fatalf("dead letters %+v: want the cause and the event's run and log sequence", dls)
	}
	if _, err := b.DeadLetters(ctx, "nope", "", 10, nil); !errors.Is(err, eventbus.ErrSinkUnknown) {
		t.Fatalf("an unknown sink: %v, want BUS_SINK_UNKNOWN", err)
	}
	// Replayed while the consumer still fails: kept.
	res, err := b.Replay(ctx, "audit", []string{dls[0].Key}, nil)
	if err != nil || len(res) != 1 || res[0].Outcome != "failed" {
		t.Fatalf("replay while refused: %+v %v, want failed", res, err)
	}
	mu.Lock()
	fixed = true
	mu.Unlock()
	res, err = b.Replay(ctx, "audit", []string{dls[0].Key, dls[1].Key, "audit.nope"}, nil)
	if err != nil || len(res) != 3 || res[0].Outcome != "delivered" || res[1].Outcome != "delivered" || res[2].Outcome != "not_found" {
		t.Fatalf("replay: %+v %v, want delivered, delivered, not_found", res, err)
	}
	got := h.received()
	if got[len(got)-2] != refused || got[len(got)-1] != flaky {
		t.Fatalf("the replayed events did not reach the consumer: %v", got[len(got)-2:])
	}
	if dls, err := b.DeadLetters(ctx, "", "", 100, nil); err != nil || len(dls) != 0 {
		t.Fatalf("after replay: %d dead letters (%v), want none", len(dls), err)
	}
	if n := metric(t, reg, "sidecar_eventbus_dead_letters", "audit"); n != 0 {
		t.Fatalf("dead letters gauge %v, want 0", n)
	}
}

// TestBus_RestartResumesAtTheCursor: a bus closed mid-log and opened
// again (another replica, or the same after a crash) delivers the rest:
// nothing lost, nothing before the cursor again.
func TestBus_RestartResumesAtTheCursor(t *testing.T) {
	f := newFixture(t)
	log := f.runs(20, "t1")
	var mu sync.Mutex
	stall := true
	h, srv := newHook(t, func(_ string, call int) int {
		mu.Lock()
		defer mu.Unlock()
		if call > 30 && stall {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	sink := webhookSink(t, "audit", vocab.Sidecar, h, srv)
	b := f.open([]eventbus.Sink{sink}, eventbus.Options{MaxAttempts: 1000})
	waitFor(t, "30 events", func() bool { return len(h.received()) >= 30 })
	b.Close(context.Background())
	mu.Lock()
	stall = false
	mu.Unlock()
	before := len(h.received())
	more := f.runs(5, "t1")
	b = f.open([]eventbus.Sink{sink}, eventbus.Options{})
	defer b.Close(context.Background())
	all := append(append([]statestore.RunEventRecord(nil), log...), more...)
	waitFor(t, "every event", func() bool { return len(h.received()) >= len(all) })
	checkOrder(t, h.received(), ids(all))
	if got := len(h.received()); got != len(all) {
		t.Fatalf("%d deliveries of %d events (%d before the restart): events before the cursor were delivered again", got, len(all), before)
	}
}

// TestBus_NATSSink: each event on its own subject in the sink's stream,
// in the log's order, in the sink's vocabulary; the bus's redelivery of
// an event is dropped by the stream (the event's id is the message id).
func TestBus_NATSSink(t *testing.T) {
	f := newFixture(t)
	log := f.runs(4, "tenant.with dots")
	ctx := context.Background()
	sink, err := eventbus.OpenNATSSink(ctx, f.js, eventbus.NATSSinkConfig{Name: "ops", Prefix: "acme", Vocabulary: vocab.Core})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := eventbus.OpenNATSSink(ctx, f.js, eventbus.NATSSinkConfig{Name: "raw", Prefix: "acme-raw"})
	if err != nil {
		t.Fatal(err)
	}
	b := f.open([]eventbus.Sink{sink, raw}, eventbus.Options{})
	defer b.Close(context.Background())
	read := func(stream string, n int) []jetstream.Msg {
		t.Helper()
		var out []jetstream.Msg
		waitFor(t, fmt.Sprintf("%d messages in %s", n, stream), func() bool {
			st, err := f.js.Stream(ctx, stream)
			return err == nil && st.CachedInfo().State.Msgs >= uint64(n)
		})
		c, err := f.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
		if err != nil {
			t.Fatal(err)
		}
		batch, err := c.FetchNoWait(n + 10)
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			out = append(out, m)
		}
		return out
	}
	msgs := read("ACME_RAW_EVENTS", len(log))
	if len(msgs) != len(log) {
		t.Fatalf("%d messages, want %d", len(msgs), len(log))
	}
	tenant := eventbus.Token("tenant.with dots")
	for i, m := range msgs {
		r := log[i]
		if want := "acme-raw.events." + tenant + "." + r.PlanID + "." + r.EventType; m.Subject() != want {
			t.Fatalf("message %d on %q, want %q", i, m.Subject(), want)
		}
		if m.Headers().Get(jetstream.MsgIDHeader) != r.EventID {
			t.Fatalf("message %d: id %q, want the eventId %s", i, m.Headers().Get(jetstream.MsgIDHeader), r.EventID)
		}
	}
	core := read("ACME_EVENTS", 1)
	var first vocab.CoreEvent
	if err := json.Unmarshal(core[0].Data(), &first); err != nil || first.Type != "EXECUTION_CREATED" || !strings.HasSuffix(core[0].Subject(), ".EXECUTION_CREATED") {
		t.Fatalf("first core event %+v on %s (%v), want EXECUTION_CREATED", first, core[0].Subject(), err)
	}
	// A redelivery (the same messages again) is dropped by the stream.
	if n, err := raw.Deliver(ctx, []eventbus.Message{{ID: log[0].EventID, Type: log[0].EventType, TenantID: "x", PlanID: "p", Body: []byte("{}")}}); err != nil || n != 1 {
		t.Fatalf("redeliver: %d %v", n, err)
	}
	st, _ := f.js.Stream(ctx, "ACME_RAW_EVENTS")
	if st.CachedInfo().State.Msgs != uint64(len(log)) {
		t.Fatalf("%d messages after a redelivery, want %d", st.CachedInfo().State.Msgs, len(log))
	}
}

// closingSink takes and acknowledges every event. The delivery of the
// event with index at is under way when the bus starts closing: the
// consumer has it and answers 100 ms later, an answer that is lost if the
// sidecar gave the request up meanwhile (its context cancelled), as with
// an HTTP consumer whose caller hung up.
type closingSink struct {
	mu      sync.Mutex
	got     []string
	at      int
	reached chan struct{} // closed when the delivery of at is under way
	closing chan struct{} // closed by the test just before Close
	once    sync.Once
}

func (s *closingSink) Name() string       { return "closing" }
func (s *closingSink) Vocabulary() string { return vocab.Sidecar }
func (s *closingSink) Batch() int         { return 1 }
func (s *closingSink) Deliver(ctx context.Context, msgs []eventbus.Message) (int, error) {
	s.mu.Lock()
	s.got = append(s.got, msgs[0].ID) // the consumer has it
	n := len(s.got)
	s.mu.Unlock()
	var gaveUp error
	if n == s.at {
		s.once.Do(func() {
			close(s.reached)
			<-s.closing
			select {
			case <-ctx.Done():
				gaveUp = ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		})
	}
	if gaveUp != nil {
		return 0, gaveUp // its answer never reached the sidecar
	}
	return 1, nil
}
func (s *closingSink) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// TestBus_CloseFinishesTheDeliveryUnderWay: a bus that closes while a
// delivery is under way lets it finish (within the delivery timeout) and
// saves its cursor, so a graceful stop delivers nothing twice. (A crash
// may: delivery is at least once.) TestBus_RestartResumesAtTheCursor saw
// the duplicate on a loaded machine.
func TestBus_CloseFinishesTheDeliveryUnderWay(t *testing.T) {
	f := newFixture(t)
	log := f.runs(5, "t1")
	sink := &closingSink{at: 7, reached: make(chan struct{}), closing: make(chan struct{})}
	b := f.open([]eventbus.Sink{sink}, eventbus.Options{})
	<-sink.reached
	close(sink.closing)
	b.Close(context.Background())
	b = f.open([]eventbus.Sink{sink}, eventbus.Options{})
	defer b.Close(context.Background())
	waitFor(t, "every event", func() bool { return len(sink.ids()) >= len(log) })
	time.Sleep(200 * time.Millisecond) // a redelivery would come at once
	if got := sink.ids(); len(got) != len(log) {
		t.Fatalf("%d deliveries of %d events: the delivery under way at the close was given up and made again", len(got), len(log))
	}
}

// TestBus_ConcurrentReplaysDeliverOnce: two replays of the same dead
// letters at once (two operators, a CLI retried) deliver each once, and
// the gauge of dead letters kept ends at 0: before, each replay delivered
// every one and the gauge went to minus their number.
func TestBus_ConcurrentReplaysDeliverOnce(t *testing.T) {
	f := newFixture(t)
	log := f.runs(2, "t1")
	var mu sync.Mutex
	fixed := false
	h, srv := newHook(t, func(string, int) int {
		mu.Lock()
		defer mu.Unlock()
		if !fixed {
			return http.StatusBadRequest
		}
		time.Sleep(20 * time.Millisecond) // a consumer taking its time: the replays overlap
		return http.StatusOK
	})
	reg := prometheus.NewRegistry()
	b := f.open([]eventbus.Sink{webhookSink(t, "audit", vocab.Sidecar, h, srv)}, eventbus.Options{MaxAttempts: 3, Metrics: eventbus.NewMetrics(reg)})
	defer b.Close(context.Background())
	waitFor(t, "every event dead-lettered", func() bool { return metric(t, reg, "sidecar_eventbus_dead_letters", "audit") == float64(len(log)) })
	mu.Lock()
	fixed = true
	mu.Unlock()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if _, err := b.Replay(context.Background(), "audit", nil, nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	seen := map[string]int{}
	for _, id := range h.received() {
		seen[id]++
	}
	for _, id := range ids(log) {
		if seen[id] != 1 {
			t.Errorf("event %s delivered %d times by the two replays, want 1", id, seen[id])
		}
	}
	if n := metric(t, reg, "sidecar_eventbus_dead_letters", "audit"); n != 0 {
		t.Fatalf("dead letters gauge %v after the replays, want 0", n)
	}
}

// TestBus_AnIngressAnsweringWhileTheConsumerIsAwayIsRetried: what a
// consumer's ingress or gateway answers while the consumer is away (404
// from a default backend, 401 or 403 during a key rotation, 502) is
// retried: the events arrive, in order, once it is back. Before, a 404 or
// a 401 dead-lettered every event at once, and their runs' order with
// them. A verdict on the event itself (400, 410, 413, 415, 422) is not.
func TestBus_AnIngressAnsweringWhileTheConsumerIsAwayIsRetried(t *testing.T) {
	f := newFixture(t)
	log := f.runs(2, "t1")
	h, srv := newHook(t, func(_ string, call int) int {
		switch {
		case call <= 2:
			return http.StatusNotFound
		case call <= 4:
			return http.StatusUnauthorized
		case call <= 5:
			return http.StatusForbidden
		}
		return http.StatusOK
	})
	reg := prometheus.NewRegistry()
	b := f.open([]eventbus.Sink{webhookSink(t, "audit", vocab.Sidecar, h, srv)}, eventbus.Options{MaxAttempts: 8, Metrics: eventbus.NewMetrics(reg)})
	defer b.Close(context.Background())
	waitFor(t, "every event", func() bool { return len(h.received()) >= len(log) })
	checkOrder(t, h.received(), ids(log))
	if n := metric(t, reg, "sidecar_eventbus_dead_lettered_total", "audit"); n != 0 {
		t.Fatalf("%v dead-lettered while the consumer's ingress answered for it, want 0", n)
	}
}

// nobody owns every sink elsewhere: this replica delivers none.
type nobody struct{}

func (nobody) Owns(string) bool { return false }

// TestBus_ASinkNobodyDeliversShowsItsLag: a replica that has a sink but
// does not deliver it (another replica owns it, one that may not have it
// configured, or is stuck) reports how far the sink's stored cursor is
// behind the log, so that a sink nobody delivers shows its lag growing
// (EVENT_BUS_STALLED). Before, only the owner reported lag, and such a
// sink showed none.
func TestBus_ASinkNobodyDeliversShowsItsLag(t *testing.T) {
	f := newFixture(t)
	log := f.runs(2, "t1")
	h, srv := newHook(t, nil)
	reg := prometheus.NewRegistry()
	b := f.open([]eventbus.Sink{webhookSink(t, "audit", vocab.Sidecar, h, srv)}, eventbus.Options{Owner: nobody{}, Metrics: eventbus.NewMetrics(reg)})
	defer b.Close(context.Background())
	waitFor(t, "the lag of the sink nobody delivers", func() bool {
		return metric(t, reg, "sidecar_eventbus_lag_events", "audit") == float64(len(log))
	})
	if got := h.received(); len(got) != 0 {
		t.Fatalf("a replica that does not own the sink delivered %d events", len(got))
	}
}
