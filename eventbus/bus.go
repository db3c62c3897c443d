// Package eventbus delivers the run event log to consumers (Execution
// Semantics §4): every persisted event, at least once, in the log's order,
// to each configured sink (a NATS subject per event, an HTTP webhook). The
// log itself is the outbox: each sink has a durable cursor in the KV bucket
// SIDECAR_EVENTBUS, the sequence of the last record all of whose events the
// sink acknowledged, and one replica (the owner of the key
// "eventbus.<sink>" among the members) follows the log from it. A consumer
// therefore never sees an event that is not persisted, and a crash
// redelivers at most the events after the cursor. A failed delivery is
// retried with exponential backoff and jitter; after MaxAttempts the event
// goes to the dead letters (the KV bucket SIDECAR_EVENTBUS_DLQ), where it
// is kept until replayed, and the sink moves on.
package eventbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
)

// Bucket is the KV bucket of the sinks' cursors.
const Bucket = "SIDECAR_EVENTBUS"

// Sink delivers events to one consumer.
type Sink interface {
	// Name names the sink: its cursor, metrics and dead letters.
	Name() string
	// Vocabulary is the vocabulary its events are in (package vocab).
	Vocabulary() string
	// Deliver hands msgs, in order, to the consumer and returns how many
	// of them (a prefix) the consumer acknowledged, with the error that
	// stopped it. An error matching ErrRejected is the consumer's
	// refusal of msgs[n] for good.
	Deliver(ctx context.Context, msgs []Message) (int, error)
}

// Batcher is a Sink that takes at most Batch messages per Deliver: the
// cursor is saved after each Deliver, so a crash delivers again at most
// one batch of acknowledged events. A sink whose consumer cannot drop
// duplicates itself delivers one at a time.
type Batcher interface {
	Batch() int
}

// Log is the event log the bus follows (natsstore.Store).
type Log interface {
	statestore.Follower
	Fetcher
}

// Owner tells whether this replica does the work of a key;
// *membership.Members satisfies it.
type Owner interface {
	Owns(key string) bool
}

// Options configures a Bus.
type Options struct {
	// Log is the event log (required).
	Log Log
	// Sinks are the consumers (none: the bus does nothing).
	Sinks []Sink
	// Owner picks the replica that delivers to a sink (nil: this one).
	// Two at once are safe (the cursor is written with compare-and-set;
	// the loser stops), only wasteful.
	Owner Owner
	// MaxAttempts is how many times an event is tried before it is
	// dead-lettered (default 8).
	MaxAttempts int
	// Backoff between attempts: InitialInterval (default 500ms) doubling
	// to MaxInterval (default 30s), each randomized by ±50%.
	InitialInterval, MaxInterval time.Duration
	// Batch is the most records read and delivered at once (default 256).
	Batch int
	// Poll is the pause between an idle sink's reads (default 5ms; a read
	// itself waits up to 100ms for the first event, which the server
	// pushes).
	Poll time.Duration
	// Timeout bounds one delivery and each NATS call (default 15s).
	Timeout time.Duration
	// Replicas is the replica count of the bucket and the dead-letter
	// stream (default 1).
	Replicas int
	Logger   *zap.Logger
	Metrics  *Metrics
}

// Bus delivers the log to its sinks.
type Bus struct {
	opts     Options
	log      *zap.Logger
	kv       jetstream.KeyValue
	dead     *deadLetters
	couriers map[string]*courier
	order    []string
}

// Open binds or creates the bucket and the dead-letter stream and starts
// one courier per sink.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Bus, error) {
	if opts.Log == nil {
		return nil, &Error{Code: CodeSinkInvalid, Message: "the bus needs the event log"}
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 8
	}
	if opts.InitialInterval <= 0 {
		opts.InitialInterval = 500 * time.Millisecond
	}
	if opts.MaxInterval <= 0 {
		opts.MaxInterval = 30 * time.Second
	}
	if opts.Batch <= 0 {
		opts.Batch = 256
	}
	if opts.Poll <= 0 {
		opts.Poll = 5 * time.Millisecond
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 15 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	b := &Bus{opts: opts, log: opts.Logger.Named("eventbus"), couriers: map[string]*courier{}}
	for _, s := range opts.Sinks {
		if _, dup := b.couriers[s.Name()]; dup {
			return nil, &Error{Code: CodeSinkInvalid, Message: fmt.Sprintf("sink name %q: names are unique", s.Name())}
		}
		if err := CheckSinkName(s.Name()); err != nil {
			return nil, err
		}
		b.couriers[s.Name()] = nil
	}
	var err error
	if b.kv, err = natsstore.OpenBucket(ctx, js, jetstream.KeyValueConfig{Bucket: Bucket, Replicas: max(opts.Replicas, 1), History: 1,
		Description: "the event bus's cursor per sink: the log sequence every event through which the sink acknowledged"}); err != nil {
		return nil, unavailable("bucket "+Bucket, err)
	}
	if b.dead, err = openDeadLetters(ctx, js, opts.Replicas); err != nil {
		return nil, err
	}
	for _, s := range opts.Sinks {
		c := &courier{bus: b, sink: s, log: b.log.With(zap.String("sink", s.Name())), m: opts.Metrics, done: make(chan struct{})}
		c.m.sink(s.Name())
		if n, err := b.dead.count(ctx, s.Name()); err == nil {
			c.m.deadLetters(s.Name(), float64(n))
		}
		b.couriers[s.Name()] = c
		b.order = append(b.order, s.Name())
		var cctx context.Context
		cctx, c.stop = context.WithCancel(context.Background())
		go c.loop(cctx)
	}
	return b, nil
}

// Close stops the couriers, letting a delivery under way finish (within
// Options.Timeout) and saving its cursor; what they had not acknowledged
// is delivered again by the next owner. It waits for them until ctx ends.
func (b *Bus) Close(ctx context.Context) error {
	for _, name := range b.order {
		b.couriers[name].stop()
	}
	for _, name := range b.order {
		select {
		case <-b.couriers[name].done:
		case <-ctx.Done():
			return fmt.Errorf("bus: close: sink %s still delivering: %w", name, ctx.Err())
		}
	}
	return nil
}

// SinkStatus is a sink as the API shows it.
type SinkStatus struct {
	Name       string `json:"name"`
	Vocabulary string `json:"vocabulary"`
	// Cursor is the log sequence through which the sink acknowledged
	// every event; LastSeq the log's last.
	Cursor      uint64 `json:"cursor"`
	LastSeq     uint64 `json:"lastSeq"`
	DeadLetters uint64 `json:"deadLetters"`
}

// Status reads every sink's cursor and dead-letter count.
func (b *Bus) Status(ctx context.Context) ([]SinkStatus, error) {
	last, err := b.opts.Log.LastSeq(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]SinkStatus, 0, len(b.order))
	for _, name := range b.order {
		cur, _, err := b.cursor(ctx, name)
		if err != nil {
			return nil, err
		}
		n, err := b.dead.count(ctx, name)
		if err != nil {
			return nil, err
		}
		out = append(out, SinkStatus{Name: name, Vocabulary: b.couriers[name].sink.Vocabulary(), Cursor: cur, LastSeq: last, DeadLetters: n})
	}
	return out, nil
}

// DeadLetters lists up to limit dead letters of sink ("" every sink)
// whose keys sort after after ("": from the first) and that keep accepts
// (nil: every one; a caller's scope, say). The ones keep refuses are
// skipped, not counted: a page is full whenever enough of them remain.
func (b *Bus) DeadLetters(ctx context.Context, sink, after string, limit int, keep func(*DeadLetter) bool) ([]DeadLetter, error) {
	if sink != "" {
		if _, ok := b.couriers[sink]; !ok {
			return nil, &Error{Code: CodeSinkUnknown, Message: "no sink named " + strconv.Quote(sink)}
		}
	}
	return b.dead.list(ctx, sink, after, limit, keep)
}

// ReplayResult is the outcome of replaying one dead letter.
type ReplayResult struct {
	Key     string `json:"key"`
	EventID string `json:"eventId,omitempty"`
	// Outcome is "delivered" (and removed from the dead letters),
	// "failed" (kept) or "not_found".
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
}

// Replay delivers the dead letters keys of sink again, once each, in the
// order given (all of sink's, oldest first, when keys is empty); a
// delivered one is removed, a failed one kept. A dead letter keep refuses
// (nil keeps every one) is left alone as if it did not exist: not_found
// when its key is given, left out when keys is empty.
func (b *Bus) Replay(ctx context.Context, sink string, keys []string, keep func(*DeadLetter) bool) ([]ReplayResult, error) {
	c, ok := b.couriers[sink]
	if !ok {
		return nil, &Error{Code: CodeSinkUnknown, Message: "no sink named " + strconv.Quote(sink)}
	}
	all := len(keys) == 0
	if all {
		var err error
		if keys, err = b.dead.keys(ctx, sink); err != nil {
			return nil, err
		}
	}
	out := make([]ReplayResult, 0, len(keys))
	for _, key := range keys {
		dl, rev, err := b.dead.getRev(ctx, key)
		if err == nil && sinkOf(key) == sink && (keep == nil || keep(&dl)) {
			// One replay at a time delivers a dead letter: two at once
			// (two operators, a retried command) would each deliver it.
			rev, err = b.dead.claim(ctx, key, dl, rev, 2*b.opts.Timeout)
		}
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, errClaimed) || (err == nil && sinkOf(key) != sink) || (err == nil && keep != nil && !keep(&dl)) {
			if !all {
				out = append(out, ReplayResult{Key: key, Outcome: "not_found"})
			}
			continue
		}
		if err != nil {
			return out, err
		}
		dctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
		_, err = c.sink.Deliver(dctx, []Message{dl.message()})
		cancel()
		if err != nil {
			b.dead.release(ctx, key, dl, rev)
			out = append(out, ReplayResult{Key: key, EventID: dl.EventID, Outcome: "failed", Error: err.Error()})
			continue
		}
		switch err := b.dead.remove(ctx, key, rev); {
		case errors.Is(err, errClaimed):
			// Another replay took it over, its claim taken for stale: it
			// removes it (and counts it gone).
		case err != nil:
			return out, err
		default:
			c.m.deadLetters(sink, -1)
		}
		c.m.replayed(sink)
		b.log.Info("dead letter replayed", zap.String("sink", sink), zap.String("key", key), zap.String("eventId", dl.EventID))
		out = append(out, ReplayResult{Key: key, EventID: dl.EventID, Outcome: "delivered"})
	}
	return out, nil
}

func (b *Bus) cursor(ctx context.Context, sink string) (uint64, uint64, error) {
	e, err := b.kv.Get(ctx, "cursor."+sink)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, unavailable("read cursor of "+sink, err)
	}
	v, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, unavailable("cursor of "+sink+" is damaged", err)
	}
	return v, e.Revision(), nil
}

// CheckSinkName refuses a sink name that is not 1 to 64 of [A-Za-z0-9_-]
// (the name keys the sink's cursor, metrics and dead letters), with
// CodeSinkInvalid.
func CheckSinkName(name string) error {
	if Token(name) != name || name == "" {
		return &Error{Code: CodeSinkInvalid, Message: fmt.Sprintf("sink name %q: names are 1 to 64 of [A-Za-z0-9_-]", name)}
	}
	return nil
}

// courier delivers the log to one sink while this replica owns it.
type courier struct {
	bus  *Bus
	sink Sink
	log  *zap.Logger
	m    *Metrics

	stop context.CancelFunc
	done chan struct{}

	// The turn as owner: the tail from the cursor, the messages read and
	// not yet acknowledged (pending, through the log sequence through),
	// the current message's failed attempts.
	tail      statestore.LogTail
	cursor    uint64
	cursorRev uint64
	pending   []Message
	through   uint64
	attempts  int
	retry     *backoff.ExponentialBackOff
	// last is the log's last sequence when the batch was read.
	last uint64
	// lagRead is when a replica that does not deliver to the sink last
	// read how far behind its cursor is.
	lagRead time.Time
}

// lagEvery is how often a replica that does not deliver to a sink reads
// the sink's cursor to report how far behind it is: a sink that nobody
// delivers (its owner does not have it configured, or is stuck) shows up
// in sidecar_eventbus_lag_events, which the EVENT_BUS_STALLED alert
// reads.
const lagEvery = 30 * time.Second

func (c *courier) loop(ctx context.Context) {
	defer close(c.done)
	defer c.endTurn()
	var wait time.Duration
	var logged time.Time
	for ctx.Err() == nil {
		more, delay, err := c.step(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			// The bus's own state (log, cursor, dead letters) failed:
			// start again from the stored cursor after a backoff.
			wait = min(max(2*wait, c.bus.opts.InitialInterval), c.bus.opts.MaxInterval)
			if time.Since(logged) > time.Minute {
				c.log.Warn("event bus: following the log failed; retrying", zap.Duration("in", wait), zap.Error(err))
				logged = time.Now()
			}
			c.endTurn()
		case more:
			wait = 0
			continue
		default:
			wait = delay
		}
		t := time.NewTimer(max(wait, c.bus.opts.Poll))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		t.Stop()
	}
}

func (c *courier) endTurn() {
	if c.tail != nil {
		c.tail.Close()
	}
	c.tail, c.pending, c.through, c.attempts = nil, nil, 0, 0
}

// readLag reports how far the sink's stored cursor is behind the log's
// end, as the owner sees it.
func (c *courier) readLag(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, c.bus.opts.Timeout)
	defer cancel()
	cursor, _, err := c.bus.cursor(ctx, c.sink.Name())
	if err != nil {
		return
	}
	if last, err := c.bus.opts.Log.LastSeq(ctx); err == nil {
		c.m.lag(c.sink.Name(), float64(last-min(last, cursor)))
	}
}

// step reads or delivers one batch. more: go on at once; otherwise wait
// delay (a delivery backoff) or the poll interval.
func (c *courier) step(ctx context.Context) (more bool, delay time.Duration, err error) {
	opts := &c.bus.opts
	name := c.sink.Name()
	if opts.Owner != nil && !opts.Owner.Owns("eventbus."+name) {
		c.endTurn()
		if time.Since(c.lagRead) >= lagEvery {
			c.lagRead = time.Now()
			c.readLag(ctx)
		}
		return false, 0, nil
	}
	if c.tail == nil {
		cctx, cancel := context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
		if c.cursor, c.cursorRev, err = c.bus.cursor(cctx, name); err != nil {
			return false, 0, err
		}
		if c.tail, err = opts.Log.Follow(cctx, c.cursor); err != nil {
			return false, 0, err
		}
	}
	if len(c.pending) == 0 {
		rctx, cancel := context.WithTimeout(ctx, opts.Timeout)
		recs, next, err := c.tail.Next(rctx, opts.Batch)
		if err == nil && len(recs) > 0 {
			c.pending, err = translate(rctx, c.sink.Vocabulary(), opts.Log, recs)
		}
		cancel()
		if err != nil {
			return false, 0, err
		}
		if next == c.cursor {
			c.m.lag(name, 0) // caught up
			return false, 0, nil
		}
		if last, err := opts.Log.LastSeq(ctx); err == nil {
			c.last = last
			c.m.lag(name, float64(last-min(last, c.cursor)))
		}
		c.through = next
		if len(c.pending) == 0 { // nothing in this vocabulary
			return true, 0, c.save(ctx, next)
		}
	}
	batch := c.pending
	if b, ok := c.sink.(Batcher); ok && b.Batch() < len(batch) {
		batch = batch[:max(b.Batch(), 1)]
	}
	// A delivery under way is not given up when the bus closes: the
	// consumer may already have the events, and a graceful stop should not
	// make it see them twice. Its timeout bounds how long Close waits.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opts.Timeout)
	n, derr := c.sink.Deliver(dctx, batch)
	cancel()
	c.m.delivered(name, n, c.pending[:n])
	if n > 0 {
		c.attempts, c.retry = 0, nil
		c.pending = c.pending[n:]
		// Saved even when the bus is closing: the sink has them, and the
		// next owner must not deliver them again (save has its own timeout).
		if err := c.save(context.WithoutCancel(ctx), c.acked()); err != nil {
			return false, 0, err
		}
		// The lag falls as the batch goes out (a webhook's is one event a
		// request), not only at the next batch's read.
		c.m.lag(name, float64(c.last-min(c.last, c.acked())))
	}
	if derr == nil {
		return true, 0, nil // the rest of pending, or the next batch
	}
	if ctx.Err() != nil {
		return false, 0, nil
	}
	c.attempts++
	c.m.failure(name)
	head := &c.pending[0]
	if c.attempts < opts.MaxAttempts && !errors.Is(derr, ErrRejected) {
		if c.retry == nil {
			c.retry = &backoff.ExponentialBackOff{InitialInterval: opts.InitialInterval, RandomizationFactor: 0.5,
				Multiplier: 2, MaxInterval: opts.MaxInterval}
			c.retry.Reset()
		}
		d := c.retry.NextBackOff()
		if c.attempts == 1 || c.attempts == opts.MaxAttempts-1 {
			c.log.Warn("event bus: delivery failed; retrying", zap.String("eventId", head.ID), zap.String("runId", head.RunID),
				zap.Int("attempt", c.attempts), zap.Duration("in", d), zap.Error(derr))
		}
		return false, d, nil
	}
	actx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	if err := c.bus.dead.add(actx, name, head, c.attempts, derr); err != nil {
		return false, 0, err
	}
	c.log.Error("event bus: event dead-lettered (EVENT_BUS_DELIVERY_FAILED); replay it with `sidecar bus replay`",
		zap.String("eventId", head.ID), zap.String("runId", head.RunID), zap.String("type", head.Type), zap.Int("attempts", c.attempts), zap.Error(derr))
	c.m.deadLettered(name)
	c.attempts, c.retry = 0, nil
	c.pending = c.pending[1:]
	return true, 0, c.save(ctx, c.acked())
}

// acked is the cursor the pending messages allow: through, when none is
// left, else the sequence before the first pending message's record.
func (c *courier) acked() uint64 {
	if len(c.pending) == 0 {
		return c.through
	}
	return c.pending[0].Seq - 1
}

// save writes the cursor, never backwards, with compare-and-set: another
// owner's write ends this turn.
func (c *courier) save(ctx context.Context, seq uint64) error {
	if seq <= c.cursor {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.bus.opts.Timeout)
	defer cancel()
	key := "cursor." + c.sink.Name()
	val := []byte(strconv.FormatUint(seq, 10))
	var rev uint64
	var err error
	if c.cursorRev == 0 {
		rev, err = c.bus.kv.Create(ctx, key, val)
	} else {
		rev, err = c.bus.kv.Update(ctx, key, val, c.cursorRev)
	}
	if err != nil {
		return unavailable("write cursor of "+c.sink.Name()+" (another replica delivering?)", err)
	}
	c.cursor, c.cursorRev = seq, rev
	return nil
}

// Streams are the JetStream streams the bus keeps its state in: its
// bucket's and the dead letters'.
func (b *Bus) Streams() []string { return []string{"KV_" + b.kv.Bucket(), "KV_" + b.dead.kv.Bucket()} }
