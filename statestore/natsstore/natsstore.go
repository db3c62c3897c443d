// Package natsstore is the JetStream backend of the run event log: the
// sidecar's default append authority.
//
// # Mapping
//
// All events live in one stream (default SIDECAR_EVENTS) on subjects
//
//	<prefix>.<runToken>.<idempotencyKey>
//
// where runToken is [RunToken] (unpadded base64url of the runId) and
// idempotencyKey the 64 lowercase hex digits of the contract. The message
// body is the RunEventWrite as JSON; messages carry no headers. The stream
// keeps at most one message per subject and discards new messages per
// subject (MaxMsgsPerSubject 1, DiscardNew, DiscardNewPerSubject), so the
// server itself refuses a second event with the same (runId,
// idempotencyKey), atomically and without using a sequence number. It denies
// delete and purge, so records are immutable, and allows direct get.
//
// runSeq is the stream sequence: strictly increasing per run, with gaps
// where other runs' events were stored in between. persistedAt is the
// timestamp the server stored with the message. The publish ack does not
// carry it, so the stream republishes the headers of every stored message
// (RePublish, headers only) to
//
//	<prefix>-appended.<runToken>.<idempotencyKey>
//
// with Nats-Sequence and Nats-Time-Stamp. The server sends that notification
// just before the ack on the same connection, so Append finds it without a
// second round trip; if it is missing (another server in a cluster ordered
// them differently, or it was dropped) Append reads the message back with a
// direct get. Other components may subscribe to these notifications to
// learn about new events of a run.
//
// # Reads
//
// Fetch uses the direct get API with multi_last on <prefix>.<runToken>.>:
// because every subject holds exactly one message, the last message of
// every subject of the run is every event of the run. The server resolves
// the run's subjects through its subject index, so the cost grows with the
// size of the run, not of the stream. Such a request is refused above 1,024
// subjects; a larger run is read with a next_by_subj batch walk instead,
// which scans the stream from afterSeq on (see Fetch). A read after a
// watermark at most tailScanMax messages behind the stream's end first
// takes up to 8 records with single next_by_subj direct gets, which the
// server answers from the stream's newest messages whatever the run's
// size; a run further ahead, or a watermark further behind, is read from
// the subject index.
//
// Server-generated Nats-* headers come after any headers a message was
// published with (direct get and republish both append them), so every
// Nats-* value is read from its last occurrence and a producer that
// publishes around Append cannot forge a runSeq or persistedAt.
//
// # Durability
//
// The publish ack is sent once the server has written the message; whether
// it was fsynced is the server's sync setting (see EmbeddedConfig). In a
// cluster, direct gets may be answered by a replica that lags the leader, so
// Fetch right after Append may miss the newest events there (never an
// older one while showing a newer one).
package natsstore

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/conductor-sidecar/sidecar/statestore"
)

var (
	_ statestore.Store     = (*Store)(nil)
	_ statestore.KeyLookup = (*Store)(nil)
)

// Defaults of Options.
const (
	// DefaultStream is the default stream name.
	DefaultStream = "SIDECAR_EVENTS"
	// DefaultSubjectPrefix is the default subject prefix of the stream.
	DefaultSubjectPrefix = "sidecar.events"
)

// appendedSuffix makes the subject prefix of the stream's appended
// notifications: <prefix>-appended.<runToken>.<idempotencyKey>.
const appendedSuffix = "-appended"

// MaxNameBytes bounds Options.Stream and Options.SubjectPrefix. With
// statestore.MaxIDBytes bounding runId, the longest subject is
// 64 + 1 + 342 + 1 + 64 = 472 bytes, far below the 4 KiB control line at
// which NATS closes a connection.
const MaxNameBytes = 64

// errCodeStoreFailed is JetStream's JSStreamStoreFailedF. With
// DiscardNewPerSubject it is what a second publish to a full subject gets
// ("maximum messages per subject exceeded"), but other storage refusals
// (stream full, message too large) share it, so Append confirms a duplicate
// by reading the subject's message.
const errCodeStoreFailed jetstream.ErrorCode = 10077

// errCodeWrongLastSeq (JSStreamWrongLastSequenceErrF) refuses a
// conditional append whose run moved on; errCodeWrongLastSeqBusy
// (JSStreamWrongLastSequenceConstantErr) is a clustered stream's answer
// while another conditional append of the run is being proposed.
const (
	errCodeWrongLastSeq     jetstream.ErrorCode = 10071
	errCodeWrongLastSeqBusy jetstream.ErrorCode = 10164
)

// Options configures Open. The zero value uses the defaults.
type Options struct {
	// Stream is the stream name (default DefaultStream).
	Stream string
	// SubjectPrefix is the subject prefix of the stream's messages
	// (default DefaultSubjectPrefix). The stream takes <prefix>.> and
	// republishes headers to <prefix>-appended.>; no other stream may
	// take either.
	SubjectPrefix string
	// Replicas is the stream's replica count (default 1).
	Replicas int
	// Logger receives the store's and the projector's logs (default nop).
	Logger *zap.Logger
	// Metrics are the store's and the projector's metrics (nil records
	// nothing).
	Metrics *statestore.Metrics
	// Alerts receives the projector's invalid-transition alerts.
	Alerts statestore.AlertSink
	// Gate makes those alerts once per (runId, eventId) across replicas and
	// restarts (see OpenAlertGate); nil: once per process.
	Gate statestore.AlertGate
	// StateBucket is the KV bucket of the stream's watermark (default
	// DefaultStateBucket), the highest sequence it is known to have reached.
	StateBucket string
	// WatermarkInterval is how often the watermark is saved while appends
	// move it (default 1s).
	WatermarkInterval time.Duration
	// Removable creates the stream so that retention can remove finished
	// runs from it (deny_purge off, metadata MetaRemovable); only a
	// Remover on the retention user's connection does, and the removal
	// ledger accounts for every record removed. It applies when the stream
	// is created: JetStream cannot turn deny_purge off on an existing
	// stream, so a stream created without it keeps every record (Purgeable
	// reports which one Open found).
	Removable bool
	// SnapshotBucket, when set, is the KV bucket where the projector
	// keeps run snapshots across restarts (DefaultSnapshotBucket for
	// serve; empty: snapshots live in memory only).
	SnapshotBucket string
}

// Store is the JetStream append authority. It is safe for concurrent use.
type Store struct {
	js        jetstream.JetStream
	nc        *nats.Conn
	name      string
	prefix    string
	apiPrefix string
	timeout   time.Duration
	log       *zap.Logger
	proj      *statestore.Projector
	stamps    *stamps
	metrics   *statestore.Metrics
	created   time.Time  // creation time of the stream Open verified
	purgeable bool       // the stream allows retention's purges
	mark      *watermark // highest sequence seen stored
	streams   []string   // the stream and the streams of its buckets (Streams)
	guard     writeGuard // fails appends fast while the stream refuses writes
}

// Open creates the event stream, or binds to it when it exists (it never
// updates it: see openStream), checks that the log is whole and not rolled
// back, subscribes to its appended notifications and returns a Store on
// it. A log that lost records, or a stream configured so that records
// could be removed, fails with an error matching statestore.ErrDamaged
// that names the damage. Close the Store when done.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Store, error) {
	if opts.Stream == "" {
		opts.Stream = DefaultStream
	}
	if opts.SubjectPrefix == "" {
		opts.SubjectPrefix = DefaultSubjectPrefix
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.StateBucket == "" {
		opts.StateBucket = DefaultStateBucket
	}
	if opts.WatermarkInterval <= 0 {
		opts.WatermarkInterval = time.Second
	}
	if err := checkName("stream", opts.Stream, false); err != nil {
		return nil, err
	}
	if err := checkName("subject prefix", opts.SubjectPrefix, true); err != nil {
		return nil, err
	}
	cfg := jetstream.StreamConfig{
		Name:                 opts.Stream,
		Description:          "sidecar run event log (append-only; one message per runId and idempotencyKey)",
		Subjects:             []string{opts.SubjectPrefix + ".>"},
		Retention:            jetstream.LimitsPolicy,
		MaxMsgs:              -1,
		MaxBytes:             -1,
		MaxMsgsPerSubject:    1,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		DenyDelete:           true,
		DenyPurge:            !opts.Removable,
		AllowDirect:          true,
		Storage:              jetstream.FileStorage,
		Replicas:             opts.Replicas,
		RePublish: &jetstream.RePublish{
			Source:      opts.SubjectPrefix + ".>",
			Destination: opts.SubjectPrefix + appendedSuffix + ".>",
			HeadersOnly: true,
		},
	}
	if opts.Removable {
		cfg.Metadata = map[string]string{MetaRemovable: "true"}
	}
	stream, err := openStream(ctx, js, cfg, opts.Logger)
	if err != nil {
		return nil, err
	}
	info := stream.CachedInfo()
	mark, err := openWatermark(ctx, js, opts.StateBucket, opts.Stream, opts.Replicas, opts.WatermarkInterval, opts.Logger.Named("natsstore"))
	if err != nil {
		return nil, err
	}
	// The log must be whole before anything is appended to it: a
	// damaged or rolled-back stream is refused here, with the reason.
	l, err := ledgerForHoles(ctx, mark.kv, opts.Stream, info.State)
	if err != nil {
		return nil, err
	}
	if err := checkState(opts.Stream, info.State, mark.high(), l); err != nil {
		return nil, err
	}
	mark.saw(info.State.LastSeq)
	st, err := subscribeStamps(js.Conn(), opts.Stream, cfg.RePublish.Destination)
	if err != nil {
		return nil, unavailable("subscribe to appended notifications", err)
	}
	s := &Store{
		created:   info.Created,
		purgeable: !info.Config.DenyPurge,
		mark:      mark,
		js:        js,
		nc:        js.Conn(),
		name:      opts.Stream,
		prefix:    opts.SubjectPrefix,
		apiPrefix: apiPrefix(js.Options()),
		timeout:   js.Options().DefaultTimeout,
		log:       opts.Logger.Named("natsstore"),
		stamps:    st,
		metrics:   opts.Metrics,
		streams:   []string{opts.Stream, "KV_" + opts.StateBucket},
		guard:     guardOf(js.Conn(), opts.Stream),
	}
	if s.timeout <= 0 {
		s.timeout = 5 * time.Second
	}
	var durable statestore.SnapshotStore
	if opts.SnapshotBucket != "" {
		if durable, err = openSnapshots(ctx, js, opts.SnapshotBucket, opts.Replicas); err != nil {
			_ = st.close()
			return nil, err
		}
		s.streams = append(s.streams, "KV_"+opts.SnapshotBucket)
	}
	// Started last: an Open that fails leaves nothing running.
	mark.start()
	s.proj = statestore.NewProjector(s, statestore.ProjectorOptions{
		Logger:     opts.Logger,
		Metrics:    opts.Metrics,
		Alerts:     opts.Alerts,
		Gate:       opts.Gate,
		Contiguous: false, // stream sequences are gappy per run by design
		Durable:    durable,
	})
	return s, nil
}

// Streams are the JetStream streams the store keeps its state in: the
// event stream, the watermark's bucket and the snapshots' bucket.
func (s *Store) Streams() []string { return append([]string(nil), s.streams...) }

// Close stops the store's subscription to appended notifications. It does
// not close the connection. The store keeps working after Close, but each
// Append then reads its message back.
func (s *Store) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	if err := s.mark.close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("save watermark: %w", err))
	}
	if err := s.stamps.close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close natsstore: %w", err)
	}
	return nil
}

// Purgeable reports whether retention can remove runs from the stream
// (it was created with Options.Removable).
func (s *Store) Purgeable() bool { return s.purgeable }

// Stream returns the name of the event stream.
func (s *Store) Stream() string { return s.name }

// Append implements statestore.Store.
//
// The event is validated, then published; a fresh append costs one round
// trip, and its persistedAt comes from the stream's appended notification.
// A duplicate (runId, idempotencyKey) is refused by the server (API error
// 10077, no sequence used); Append then reads the stored record and returns
// its metadata. If the result is unknown (timeout, lost connection), the
// error matches statestore.ErrUnavailable and the same event can be
// appended again. While the embedded server reports a write error of the
// stream (Embedded.Check), Append fails at once, without a request, with
// an error matching both statestore.ErrUnavailable and ErrWriteRefused.
func (s *Store) Append(ctx context.Context, w *statestore.RunEventWrite) (statestore.AppendResult, error) {
	began := time.Now()
	res, err := s.append(ctx, w, -1)
	s.metrics.Appended(res, err, time.Since(began))
	return res, err
}

// AppendIf implements statestore.Store. The publish carries
// Nats-Expected-Last-Subject-Sequence lastSeq for the filter
// <prefix>.<runToken>.> (nats-server 2.11+): the stream stores it only if
// the run's last message is lastSeq, in the same step as the write. Every
// conditional append of a run names the same filter, so that a clustered
// stream also serializes them while one is being proposed. The two headers
// stay on the stored message; records ignore them.
//
// A refused condition is a RUN_CHANGED error, unless the event's own
// subject already holds it (a retry of a conditional append that
// persisted): that is answered as a duplicate.
func (s *Store) AppendIf(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	began := time.Now()
	res, err := s.append(ctx, w, max(lastSeq, 0))
	s.metrics.Appended(res, err, time.Since(began))
	return res, err
}

// append publishes w; lastSeq >= 0 makes the publish conditional.
func (s *Store) append(ctx context.Context, w *statestore.RunEventWrite, lastSeq int64) (statestore.AppendResult, error) {
	if err := statestore.ValidateWrite(w); err != nil {
		return statestore.AppendResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return statestore.AppendResult{}, unavailable("append", err)
	}
	if err := s.guard.before(); err != nil {
		return statestore.AppendResult{}, unavailable("append", err)
	}
	body, err := statestore.EncodeWrite(w)
	if err != nil {
		return statestore.AppendResult{}, fmt.Errorf("encode event: %w", err)
	}
	subj := s.subject(w.RunID, w.IdempotencyKey)
	s.stamps.wait(subj)
	defer s.stamps.done(subj)
	// No headers: a message without any gets the server's fast path on
	// every direct get. The stream owns <prefix>.> (JetStream refuses
	// overlapping streams), and the ack names the stream that stored it.
	msg := &nats.Msg{Subject: subj, Data: body}
	if lastSeq >= 0 {
		msg.Header = nats.Header{
			jetstream.ExpectedLastSubjSeqHeader:     {strconv.FormatInt(lastSeq, 10)},
			jetstream.ExpectedLastSubjSeqSubjHeader: {s.prefix + "." + RunToken(w.RunID) + ".>"},
		}
	}
	// The publish is one request, bounded as every other: a caller's
	// distant deadline must not hold a lost one (and the run's writes
	// behind it) that long. Each read below bounds its own.
	pctx, cancel := s.requestContext(ctx)
	ack, err := s.js.PublishMsg(pctx, msg)
	cancel()
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStoreFailed {
			return s.existing(ctx, subj, err)
		}
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == errCodeWrongLastSeq || apiErr.ErrorCode == errCodeWrongLastSeqBusy) {
			res, stored, xerr := s.duplicate(ctx, subj)
			if !stored && xerr == nil {
				return statestore.AppendResult{}, statestore.RunChanged(w.RunID, lastSeq, -1)
			}
			return res, xerr
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			// Nobody answered the publish: the stream is gone, or (in a
			// cluster) the client is between servers, or the stream's
			// leader is being elected. Only the first is damage; ask.
			sctx, cancel := s.requestContext(ctx)
			_, serr := s.js.Stream(sctx, s.name)
			cancel()
			if errors.Is(serr, jetstream.ErrStreamNotFound) {
				return statestore.AppendResult{}, damaged(fmt.Sprintf("append: no stream takes subject %s: stream %s was deleted (see /readyz)", s.prefix+".>", s.name), err)
			}
			return statestore.AppendResult{}, unavailable("append (no response from the stream; it exists)", err)
		}
		return statestore.AppendResult{}, unavailable("append", s.guard.after(err))
	}
	if ack.Stream != s.name {
		return statestore.AppendResult{}, fmt.Errorf("append: stored by stream %q, want %q", ack.Stream, s.name)
	}
	s.mark.saw(ack.Sequence)
	m := s.stamps.take(subj)
	if m == nil || m.seq != ack.Sequence {
		// No stamp before the ack (another server republished it out of
		// order, or the stamp was dropped): read the message back. The
		// subject holds exactly this message, so its last message is it.
		s.log.Debug("no appended notification before the ack; reading the message back",
			zap.String("subject", subj), zap.Uint64("seq", ack.Sequence))
		m, err = s.ackedMsg(ctx, subj)
		if err == nil && m.seq != ack.Sequence {
			err = fmt.Errorf("subject %q holds sequence %d, acknowledged %d", subj, m.seq, ack.Sequence)
		}
		if err != nil {
			return statestore.AppendResult{}, unavailable("read persistedAt", err)
		}
	}
	return statestore.AppendResult{
		EventID:     w.EventID,
		RunSeq:      int64(m.seq),
		PersistedAt: statestore.FormatPersistedAt(m.time),
		Persisted:   true,
	}, nil
}

// existing answers a publish that the server refused with 10077: if the
// subject holds a message, the append was a duplicate of it.
func (s *Store) existing(ctx context.Context, subj string, pubErr error) (statestore.AppendResult, error) {
	res, stored, err := s.duplicate(ctx, subj)
	if err == nil && !stored {
		// 10077 without a stored message: the stream refused the write
		// for another reason (full, message too large).
		return statestore.AppendResult{}, unavailable("append", pubErr)
	}
	return res, err
}

// duplicate reads the record the event's subject holds: stored is false,
// with no error, when the subject is empty.
func (s *Store) duplicate(ctx context.Context, subj string) (res statestore.AppendResult, stored bool, err error) {
	m, err := s.ackedMsg(ctx, subj)
	if errors.Is(err, errNotFound) {
		return statestore.AppendResult{}, false, nil
	}
	if err != nil {
		return statestore.AppendResult{}, false, unavailable("read duplicate", err)
	}
	rec, err := s.record(m)
	if err != nil {
		// Something other than Append wrote this subject; retrying will not help.
		return statestore.AppendResult{}, true, fmt.Errorf("append: subject %s is taken by a message that is not a record: %w", subj, err)
	}
	return statestore.AppendResult{
		EventID:     rec.EventID,
		RunSeq:      rec.RunSeq,
		PersistedAt: rec.PersistedAt,
		Idempotent:  true,
	}, true, nil
}

// fetchMaxBytes caps the bytes the server sends per Fetch request, well
// below a subscription's default pending limit (64 MiB); the rest of the
// run comes in the next page.
const fetchMaxBytes = 8 << 20

// walkBatch is the page size of the next_by_subj walk when Fetch has no limit.
const walkBatch = 1024

// Fetch implements statestore.Store.
//
// It pages with direct get requests whose seq is one past the last runSeq
// received, so pages never overlap or skip. Runs of up to 1,024 events are
// read with multi_last: the server returns the run's messages in ascending
// sequence order from a single read of its subject index, skipping those
// below seq before loading them; batch bounds the count to limit, and a
// page cut short by max_bytes reports the rest in Nats-Num-Pending of its
// end-of-batch message. multi_last counts every subject of the run against
// its 1,024 cap whatever seq is (up_to_seq cannot page past it either), so
// for a larger run the server answers 413 and Fetch reads the run's 16
// subject buckets (see EventSubject) with one multi_last each and merges
// them, which serves runs up to about 16,000 events from the subject index.
// Only a bucket that itself holds more than 1,024 events is read with a
// next_by_subj batch walk from afterSeq+1, a scan of the stream from there.
// With afterSeq > 0 (a projector catching up) Fetch reads first with
// fetchTail, so a run's newest records cost the same whatever its size.
//
// The store's timeout (the JetStream context's default timeout) bounds
// each wait for the server, not the whole read: the wait for a request's
// first message and for each next one, and each leader get. A large run
// read in many pages, or a page that a loaded machine receives and decodes
// slowly, makes the read longer, not failed; a server that stops answering
// fails it within one timeout. A deadline of ctx bounds the whole read.
//
// A message on the run's subjects that is not a valid record of the run
// (something other than Append published it) is logged and skipped.
func (s *Store) Fetch(ctx context.Context, runID string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error) {
	if !validRunID(runID) {
		return []statestore.RunEventRecord{}, nil // ValidateWrite never let such a run in
	}
	if err := ctx.Err(); err != nil {
		return nil, unavailable("fetch", err)
	}
	base := s.prefix + "." + RunToken(runID)
	out, err := s.fetch(ctx, runID, base, afterSeq, limit)
	if err == nil && afterSeq <= 0 && (limit <= 0 || len(out) < limit) {
		// A read of the whole run (what retention archives, a cold
		// projection of a run that fits a page, a listing of its events
		// from the start): every record the stream indexes for it, or
		// STORE_DAMAGED.
		err = s.checkWhole(ctx, runID, base+".>", out)
	}
	if err != nil || !statestore.Latest(ctx) || (limit > 0 && len(out) >= limit) {
		return out, err
	}
	// A read that must see every append before it: what the direct gets
	// (any replica) did not show, the leader does. The leader's last
	// record of the run (from the subject index, at a cost that follows
	// the run) usually says there is nothing more; only past it does the
	// leader walk the stream from the last record read.
	last := afterSeq
	if len(out) > 0 {
		last = out[len(out)-1].RunSeq
	}
	if limit > 0 {
		limit -= len(out)
	}
	newest, err := s.leaderLast(ctx, base+".>")
	if err != nil {
		return nil, err
	}
	if newest <= uint64(max(last, 0)) {
		return out, nil
	}
	more, err := s.leaderFetchFrom(ctx, runID, base+".>", uint64(max(last, 0))+1, limit)
	if err != nil {
		return nil, err
	}
	return append(out, more...), nil
}

// fetch is Fetch's read through direct gets.
func (s *Store) fetch(ctx context.Context, runID, base string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error) {
	if afterSeq <= 0 || !s.shortTail(afterSeq) {
		return s.fetchIndexed(ctx, runID, base, afterSeq, limit)
	}
	tail, cursor, done, err := s.fetchTail(ctx, runID, base+".>", afterSeq, limit)
	if err != nil || done {
		return tail, err
	}
	if limit > 0 {
		limit -= len(tail)
	}
	rest, err := s.fetchIndexed(ctx, runID, base, cursor, limit)
	if err != nil {
		return nil, err
	}
	return append(tail, rest...), nil
}

// tailScanMax is the most stream messages after a watermark for which
// Fetch reads a run's newest records with next_by_subj (fetchTail). The
// server finds a next_by_subj match by scanning the stream from the
// sequence on, every message's subject tokenized and matched, and a read
// that finds nothing new scans to the stream's end: with many runs in
// flight each run's records are far apart, and that scan cost serve more
// than anything else (BENCHMARKS.md). Past this many, the run's subject
// index (multi_last) is read instead, whose cost follows the run's records,
// not the stream's.
const tailScanMax = 128

// shortTail reports whether at most tailScanMax messages were stored after
// afterSeq, as far as this Store saw: its own appends, the stream's last
// sequence at Open, every message it read and the stream's last sequence
// each subject index read reports. Another writer's appends since this
// Store's last read make the tail longer than it knows, never shorter.
func (s *Store) shortTail(afterSeq int64) bool {
	seen := s.mark.seen.Load()
	return seen <= uint64(afterSeq)+tailScanMax
}

// tailReads bounds the single next_by_subj direct gets with which Fetch
// reads what follows a watermark; a run further ahead is read from the
// subject index for the rest.
const tailReads = 8

// fetchTail reads runID's records after afterSeq with single next_by_subj
// direct gets, one record each, until the server has none (done) or
// tailReads were made. The server finds each from the sequence on,
// scanning the stream's newest messages, so a projector catching up on
// a run's newest record costs the same whatever the run's size; a
// multi_last, or a batch get's pending count, matches every subject of
// the run. cursor is the last sequence read.
func (s *Store) fetchTail(ctx context.Context, runID, filter string, afterSeq int64, limit int) (out []statestore.RunEventRecord, cursor int64, done bool, err error) {
	out = []statestore.RunEventRecord{}
	cursor = afterSeq
	for range tailReads {
		if limit > 0 && len(out) >= limit {
			return out, cursor, true, nil
		}
		m, err := s.nextMsg(ctx, directRequest{Seq: uint64(cursor) + 1, NextFor: filter})
		if errors.Is(err, errNotFound) {
			return out, cursor, true, nil
		}
		if err != nil {
			return nil, 0, false, unavailable("fetch", err)
		}
		cursor = int64(m.seq)
		if rec, ok := s.runRecord(runID, m); ok {
			out = append(out, rec)
		}
	}
	return out, cursor, limit > 0 && len(out) >= limit, nil
}

// fetchIndexed reads runID's records after afterSeq from the subject index
// (multi_last), bucket by bucket past 1,024 subjects.
func (s *Store) fetchIndexed(ctx context.Context, runID, base string, afterSeq int64, limit int) ([]statestore.RunEventRecord, error) {
	out, err := s.fetchFilter(ctx, runID, base+".>", afterSeq, limit, false)
	if err == nil && len(out) == 0 && afterSeq <= 0 {
		// Direct gets are answered by any replica of a replicated stream,
		// and a follower may not have applied a run's first events yet:
		// a run started through one sidecar was RUN_NOT_FOUND through
		// another (TestE2E_Chaos). Before a run is said not to exist, the
		// leader is asked.
		return s.leaderFetch(ctx, runID, base+".>", limit)
	}
	if !errors.Is(err, errTooManyResults) {
		return out, err
	}
	// More than 1,024 events: read each of the 16 buckets with its own
	// multi_last (each capped at 1,024 again) and merge. With a limit, the
	// first limit records of every bucket contain the first limit overall.
	s.log.Debug("run exceeds multi_last's 1,024 subjects; reading its 16 buckets", zap.String("runId", runID))
	var all []statestore.RunEventRecord
	for i := range keyBuckets {
		recs, err := s.fetchFilter(ctx, runID, base+"."+keyBuckets[i:i+1]+".>", afterSeq, limit, true)
		if err != nil {
			return nil, err
		}
		all = append(all, recs...)
	}
	all = sortedBySeq(all)
	if limit > 0 && len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

// keyBuckets are the first characters of an idempotencyKey: the bucket
// token of an event's subject.
const keyBuckets = "0123456789abcdef"

// fetchFilter reads the records of runID on the subjects matching filter,
// in runSeq order. A filter matching more than 1,024 subjects makes
// multi_last fail: then, with walk set, it reads with a next_by_subj batch
// walk instead; without, it returns errTooManyResults.
func (s *Store) fetchFilter(ctx context.Context, runID, filter string, afterSeq int64, limit int, walk bool) ([]statestore.RunEventRecord, error) {
	out := []statestore.RunEventRecord{}
	cursor := uint64(max(afterSeq, 0))
	multi := true
	for limit <= 0 || len(out) < limit {
		req := directRequest{Seq: cursor + 1, MaxBytes: fetchMaxBytes}
		if limit > 0 {
			req.Batch = min(limit-len(out), walkBatch) // getBatch sizes its channel by it
		}
		if multi {
			req.MultiLast = []string{filter}
		} else {
			req.NextFor = filter
			if req.Batch == 0 {
				req.Batch = walkBatch
			}
		}
		eob, err := s.getBatch(ctx, req, s.timeout, func(m *storedMsg) {
			if rec, ok := s.runRecord(runID, m); ok {
				out = append(out, rec)
			}
		})
		switch {
		case errors.Is(err, errTooManyResults) && multi:
			if !walk {
				return nil, err
			}
			s.log.Debug("more than 1,024 events on one filter; walking the stream",
				zap.String("runId", runID), zap.String("filter", filter), zap.Uint64("afterSeq", cursor))
			multi = false
			continue
		case errors.Is(err, errNotFound):
			return sortedBySeq(out), nil
		case err != nil:
			return nil, unavailable("fetch", err)
		}
		if eob.pending == 0 {
			break
		}
		if eob.lastSeq <= cursor {
			return nil, unavailable("fetch", fmt.Errorf("direct get made no progress after sequence %d", cursor))
		}
		cursor = eob.lastSeq
	}
	return sortedBySeq(out), nil
}

// leaderLast returns the sequence of the last message on filter that the
// stream leader holds, 0 if none.
func (s *Store) leaderLast(ctx context.Context, filter string) (uint64, error) {
	m, err := s.leaderMsg(ctx, directRequest{LastFor: filter})
	switch {
	case errors.Is(err, errNotFound):
		return 0, nil
	case err != nil:
		return 0, unavailable("fetch from the stream leader", err)
	}
	return m.seq, nil
}

// leaderFetch reads runID's records on filter from the stream leader, one
// message API request per record: the way to read a run the direct gets
// did not show, which is usually none (one request that finds nothing).
func (s *Store) leaderFetch(ctx context.Context, runID, filter string, limit int) ([]statestore.RunEventRecord, error) {
	return s.leaderFetchFrom(ctx, runID, filter, 1, limit)
}

// leaderFetchFrom is leaderFetch from stream sequence next on.
func (s *Store) leaderFetchFrom(ctx context.Context, runID, filter string, next uint64, limit int) ([]statestore.RunEventRecord, error) {
	out := []statestore.RunEventRecord{}
	for limit <= 0 || len(out) < limit {
		m, err := s.leaderMsg(ctx, directRequest{Seq: next, NextFor: filter})
		if errors.Is(err, errNotFound) {
			break
		}
		if err != nil {
			return nil, unavailable("fetch from the stream leader", err)
		}
		next = m.seq + 1
		if rec, ok := s.runRecord(runID, m); ok {
			out = append(out, rec)
		}
	}
	if len(out) > 0 {
		s.log.Info("a run the direct gets did not show was read from the stream leader (a replica is behind)",
			zap.String("runId", runID), zap.Int("records", len(out)))
	}
	return out, nil
}

// Lookup implements statestore.KeyLookup with one direct get of the
// subject's last message. It returns statestore.ErrNotFound when the run has
// no event with that key.
func (s *Store) Lookup(ctx context.Context, runID, idempotencyKey string) (*statestore.RunEventRecord, error) {
	if !validRunID(runID) || !validKey(idempotencyKey) {
		return nil, statestore.ErrNotFound
	}
	m, err := s.msg(ctx, s.subject(runID, idempotencyKey))
	if errors.Is(err, errNotFound) {
		return nil, statestore.ErrNotFound
	}
	if err != nil {
		return nil, unavailable("lookup", err)
	}
	rec, err := s.record(m)
	if err != nil {
		return nil, unavailable("lookup", err)
	}
	return &rec, nil
}

// GetSnapshot implements statestore.Store.
func (s *Store) GetSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	return s.proj.Snapshot(ctx, runID)
}

// ProjectSnapshot implements statestore.Store.
func (s *Store) ProjectSnapshot(ctx context.Context, runID string) (*statestore.RunSnapshot, error) {
	return s.proj.Project(ctx, runID)
}

// RunToken returns the subject token of runID: its UTF-8 bytes in unpadded
// base64url. The token uses only A-Z, a-z, 0-9, '-' and '_', so it is a
// single subject token without wildcards and a valid KV key; it is at most
// 342 bytes for a runId of statestore.MaxIDBytes.
func RunToken(runID string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(runID))
}

// ParseRunToken returns the runId that RunToken encoded as tok.
func ParseRunToken(tok string) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", fmt.Errorf("parse run token: %w", err)
	}
	return string(b), nil
}

func (s *Store) subject(runID, key string) string {
	return EventSubject(s.prefix, runID, key)
}

// EventSubject returns the subject of the event with idempotencyKey key of
// runID under prefix: <prefix>.<runToken>.<bucket>.<key>, where bucket is
// the key's first hex digit. The bucket spreads a run over 16 subject
// groups so that Fetch can read runs of more than 1,024 events (the cap of
// one multi_last direct get) from the subject index instead of scanning.
func EventSubject(prefix, runID, key string) string {
	bucket := "_"
	if key != "" {
		bucket = key[:1]
	}
	return prefix + "." + RunToken(runID) + "." + bucket + "." + key
}

// runRecord is record for a message read as one of runID's; a message
// that is not a valid record of the run (something other than Append
// published it) is logged and skipped (ok false).
func (s *Store) runRecord(runID string, m *storedMsg) (rec statestore.RunEventRecord, ok bool) {
	rec, err := s.record(m)
	if err == nil && rec.RunID != runID {
		err = fmt.Errorf("record of run %q", rec.RunID)
	}
	if err != nil {
		s.log.Warn("skipping a message that is not a record of the run",
			zap.String("runId", runID), zap.String("subject", m.subject), zap.Uint64("seq", m.seq), zap.Error(err))
		return rec, false
	}
	return rec, true
}

// record decodes a stored message into a record, checking that its subject
// is the one Append would have used for it.
func (s *Store) record(m *storedMsg) (statestore.RunEventRecord, error) {
	var rec statestore.RunEventRecord
	if err := json.Unmarshal(m.data, &rec.RunEventWrite); err != nil {
		return rec, fmt.Errorf("decode record %d: %w", m.seq, err)
	}
	if want := s.subject(rec.RunID, rec.IdempotencyKey); m.subject != want {
		return rec, fmt.Errorf("record %d is on subject %q, want %q", m.seq, m.subject, want)
	}
	if len(rec.Payload) == 0 {
		rec.Payload = nil
	}
	rec.RunSeq = int64(m.seq)
	rec.PersistedAt = statestore.FormatPersistedAt(m.time)
	return rec, nil
}

func validRunID(runID string) bool {
	return statestore.CheckID(runID, false) == nil
}

func validKey(k string) bool {
	if len(k) != 64 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// checkName accepts 1 to MaxNameBytes of [A-Za-z0-9_-], and for a subject
// prefix several such tokens joined by '.'.
func checkName(what, v string, dots bool) error {
	if v == "" || len(v) > MaxNameBytes {
		return fmt.Errorf("natsstore: %s %q must be 1 to %d bytes", what, v, MaxNameBytes)
	}
	tokens := []string{v}
	if dots {
		tokens = strings.Split(v, ".")
	}
	for _, tok := range tokens {
		if tok == "" || strings.Trim(tok, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" {
			return fmt.Errorf("natsstore: %s %q must be tokens of A-Z, a-z, 0-9, '_' and '-'", what, v)
		}
	}
	return nil
}

// sortedBySeq returns recs in runSeq order. The server sends ascending
// sequences (it sorts them, and one connection keeps their order); this
// checks rather than assumes.
func sortedBySeq(recs []statestore.RunEventRecord) []statestore.RunEventRecord {
	byseq := func(a, b statestore.RunEventRecord) int { return cmp.Compare(a.RunSeq, b.RunSeq) }
	if !slices.IsSortedFunc(recs, byseq) {
		slices.SortFunc(recs, byseq)
	}
	return recs
}

func unavailable(op string, err error) error {
	return &statestore.Error{Code: statestore.CodeStoreUnavailable, Message: op + ": " + err.Error(), Err: err}
}

// ForgetRun drops runID's snapshot from the projector's memory, for a run
// that leaves hot state (a retention Forgetter); the log is not touched.
func (s *Store) ForgetRun(_ context.Context, runID string) error {
	s.proj.Forget(runID)
	return nil
}
