package natsstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

var _ statestore.Follower = (*Store)(nil)

// Follow implements statestore.Follower with an ordered consumer of the
// stream from sequence afterSeq+1, read through one long-lived pull
// iterator: the server reads the stream in order and pushes it, at a cost
// that follows the events read, not the size of the log. (A direct get
// with next_by_subj on the stream's wildcard, tried first, resolves the
// next match through the subject index and slowed from 43k events/s at
// 50k events to 8k at 550k; an ordered consumer's Fetch recreates the
// consumer at every call.) The stream denies delete and purge, so the
// sequences a tail passes never come back.
func (s *Store) Follow(ctx context.Context, afterSeq uint64) (statestore.LogTail, error) {
	it, err := s.follow(ctx, afterSeq)
	if err != nil {
		return nil, err
	}
	return &tail{s: s, it: it, next: afterSeq, progress: time.Now()}, nil
}

// follow opens an ordered consumer's pull iterator from afterSeq+1.
func (s *Store) follow(ctx context.Context, afterSeq uint64) (jetstream.MessagesContext, error) {
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	cons, err := s.js.OrderedConsumer(ctx, s.name, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: afterSeq + 1,
		// Without a bound, Next recreates the consumer of a deleted
		// stream forever and never returns (serve hung at shutdown,
		// TestStore_FollowAStreamDeleted): the follower ends its turn
		// on the error instead, and follows anew after a backoff.
		MaxResetAttempts: 3,
	})
	if err != nil {
		return nil, unavailable("follow", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(walkBatch))
	if err != nil {
		return nil, unavailable("follow", err)
	}
	return it, nil
}

// tail is a statestore.LogTail on an ordered consumer.
type tail struct {
	s    *Store
	it   jetstream.MessagesContext
	next uint64 // the sequence read through
	// progress is when a message last arrived (or the consumer was
	// opened), checked is when the tail last asked the stream whether it
	// is behind (stallAfter).
	progress, checked time.Time
	// reopenedFor is the stream's last sequence when the tail last
	// reopened its consumer: records purged before the tail read them
	// leave the stream's last sequence past the tail for good, and are
	// not a reason to reopen again.
	reopenedFor uint64
}

// tailWait is how long Next waits for a first message.
const tailWait = 100 * time.Millisecond

// stallAfter is how long a tail may get nothing before it asks the stream
// whether it holds records past the tail's position (one stream info at
// most every stallAfter while the tail is idle). If it does, the consumer
// is stalled: alive, no error, delivering nothing, as an overloaded server
// left one for good under a steady load (TestStore_FollowAStalledConsumer
// causes it with a consumer paused on the server), and the tail opens a
// new one from its position.
const stallAfter = 10 * time.Second

// Next implements statestore.LogTail: it waits up to 100 ms (or ctx) for
// a first message, then takes what has arrived. A message that is not a
// valid record is logged and passed. A tail that has got nothing for
// stallAfter while the stream holds records past it reopens its consumer.
func (t *tail) Next(ctx context.Context, limit int) ([]statestore.RunEventRecord, uint64, error) {
	if limit <= 0 {
		limit = walkBatch
	}
	var out []statestore.RunEventRecord
	for n := 0; n < limit; n++ {
		wait := time.Millisecond // what has arrived
		if n == 0 {
			wait = tailWait
			if d, ok := ctx.Deadline(); ok {
				wait = min(wait, max(time.Until(d), time.Millisecond))
			}
		}
		m, err := t.it.Next(jetstream.NextMaxWait(wait))
		if errors.Is(err, nats.ErrTimeout) {
			break
		}
		if err != nil {
			return out, t.next, unavailable("follow", err)
		}
		t.progress = time.Now()
		meta, err := m.Metadata()
		if err != nil {
			return out, t.next, unavailable("follow", fmt.Errorf("message metadata: %w", err))
		}
		seq := meta.Sequence.Stream
		if seq <= t.next {
			continue // never sent by an ordered consumer; a tail must not go back
		}
		t.next = seq
		rec, err := t.s.record(&storedMsg{subject: m.Subject(), seq: seq, time: meta.Timestamp, data: m.Data()})
		if err != nil {
			t.s.log.Warn("follow: skipping a message that is not a record", zap.String("subject", m.Subject()), zap.Uint64("seq", seq), zap.Error(err))
			continue
		}
		rec.LogSeq = seq
		out = append(out, rec)
	}
	if len(out) == 0 {
		if err := t.unstall(ctx); err != nil {
			return out, t.next, err
		}
	}
	return out, t.next, nil
}

// unstall reopens the tail's consumer when it has delivered nothing for
// stallAfter while the stream holds records past the tail's position.
func (t *tail) unstall(ctx context.Context) error {
	now := time.Now()
	if now.Sub(t.progress) < stallAfter || now.Sub(t.checked) < stallAfter {
		return nil
	}
	t.checked = now
	last, err := t.s.LastSeq(ctx)
	if err != nil || last <= t.next || last == t.reopenedFor {
		return nil // nothing to read, or the next call asks again
	}
	t.s.log.Warn("follow: the stream's consumer delivered nothing for a while though the stream holds records past it; opening a new one",
		zap.Uint64("through", t.next), zap.Uint64("streamLast", last), zap.Duration("idle", now.Sub(t.progress)))
	it, err := t.s.follow(ctx, t.next)
	if err != nil {
		return err
	}
	t.it.Stop()
	t.it = it
	t.progress = now
	t.reopenedFor = last
	return nil
}

// Close implements statestore.LogTail: it stops the iterator, and the
// ephemeral consumer goes.
func (t *tail) Close() { t.it.Stop() }

// LastSeq implements statestore.Follower. It asks the stream leader
// (stream info), never a replica that is behind.
func (s *Store) LastSeq(ctx context.Context) (uint64, error) {
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	st, err := s.js.Stream(ctx, s.name)
	if err != nil {
		return 0, unavailable("stream info", err)
	}
	return st.CachedInfo().State.LastSeq, nil // js.Stream read the info
}
