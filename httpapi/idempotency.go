package httpapi

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/conductor-sidecar/sidecar/statestore/natsstore"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// IdempotencyKeyHeader names the header that makes a control call
// replayable: the first answer to a key is kept and returned again for
// every later request with that key (on any replica, across restarts).
const IdempotencyKeyHeader = "Idempotency-Key"

// ReplayedHeader is set to "true" on an answer that is a replay.
const ReplayedHeader = "Idempotent-Replayed"

// MaxIdempotencyKeyBytes bounds the header's value.
const MaxIdempotencyKeyBytes = 255

// Reply is a kept answer.
type Reply struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

// Errors of Replies.
var (
	// ErrReplyPending: another request holds the key and has not answered.
	ErrReplyPending = errors.New("httpapi: a request with this idempotency key is in progress")
	// ErrKeyReused: the key is held by a request with another fingerprint.
	ErrKeyReused = errors.New("httpapi: idempotency key reused for another request")
)

// Replies keeps the first answer of each control request that carried an
// Idempotency-Key.
type Replies interface {
	// Claim reserves key for a request with fingerprint fp. It returns
	// (nil, nil) when the caller should answer the request, the kept reply
	// when the key was answered, ErrReplyPending while another request
	// holds it, and ErrKeyReused when fp differs from the first request's.
	Claim(ctx context.Context, key, fp string) (*Reply, error)
	// Keep stores the answer of a claimed key.
	Keep(ctx context.Context, key, fp string, r *Reply) error
	// Release gives a claimed key up without an answer (the request failed
	// in a way a retry may fix), so that a retry runs it again.
	Release(ctx context.Context, key string) error
}

// KVReplies keeps replies in a JetStream KV bucket, shared by every
// sidecar on the same NATS.
type KVReplies struct {
	kv jetstream.KeyValue
	js jetstream.JetStream
	// partBytes is the most a kept answer's entry may hold; a larger
	// answer is kept gzipped in parts of at most this size (keepParts).
	partBytes int
	// StaleAfter is how long a claim without an answer blocks its key
	// (a process that died mid-request); then a retry takes it over.
	StaleAfter time.Duration
	now        func() time.Time
}

// KVRepliesBucket is the bucket's name.
const KVRepliesBucket = "SIDECAR_CONTROL_REPLIES"

// KVRepliesOptions configure OpenKVReplies.
type KVRepliesOptions struct {
	// TTL is how long an answer is kept (default 24h).
	TTL time.Duration
	// Replicas of the bucket when OpenKVReplies creates it (default 1).
	Replicas int
	// MaxBytes bounds the bytes the bucket holds (default
	// DefaultRepliesMaxBytes). When a new answer would pass it, the
	// oldest entries are evicted (discard old): a keyed request is never
	// refused for want of room, and a key whose answer was evicted runs
	// its action again, as a key never seen does.
	MaxBytes int64
	// Log gets the warning of a bucket whose bound could not be set.
	Log *zap.Logger
}

// DefaultRepliesMaxBytes is the replies bucket's bound by default: 1 GiB.
const DefaultRepliesMaxBytes = 1 << 30

// OpenKVReplies creates (or opens) the bucket. A bucket that exists with
// another bound or discard policy (one created before the bound) is used
// as it is, with one warning naming the command that aligns it.
func OpenKVReplies(ctx context.Context, js jetstream.JetStream, opts KVRepliesOptions) (*KVReplies, error) {
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("open %s: MaxBytes %d: want more than 0 (0 is %d)", KVRepliesBucket, opts.MaxBytes, DefaultRepliesMaxBytes)
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultRepliesMaxBytes
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	want := repliesStream(opts)
	// A bucket made before (a restart) is used as it is: creating it again
	// asks the server to reserve its bound a second time, beside what the
	// bucket holds, which a volume with room for the bucket refuses.
	_, err := js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		err = createReplies(ctx, js, &want, opts.Log)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another replica made it meanwhile
			err = reportBound(ctx, js, want, opts.Log)
		}
	case err == nil:
		err = reportBound(ctx, js, want, opts.Log)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", KVRepliesBucket, err)
	}
	kv, err := natsstore.BindBucket(ctx, js, KVRepliesBucket)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", KVRepliesBucket, err)
	}
	return &KVReplies{kv: kv, js: js, partBytes: replyPartBytes(js.Conn().MaxPayload()), StaleAfter: time.Minute, now: time.Now}, nil
}

// minRepliesBytes is the least bound createReplies lowers a bound to: a
// bulk answer is kept in parts of up to about 1 MiB, so the bucket must
// hold several.
const minRepliesBytes = 16 << 20

// errStorageResourcesExceeded is JetStream's refusal of a stream whose
// MaxBytes is more than the server (or the account) has left to reserve.
const errStorageResourcesExceeded jetstream.ErrorCode = 10047

// createReplies creates the bucket's stream as want says. JetStream
// reserves a bounded stream's MaxBytes out of the server's storage (on the
// embedded server, most of the data dir's free space at start) and
// refuses a bound it cannot reserve; on a small volume the default bound
// would keep serve from starting. So a refused bound is halved until the
// server takes it, down to minRepliesBytes, and one warning says what was
// kept (want.MaxBytes is then that bound).
func createReplies(ctx context.Context, js jetstream.JetStream, want *jetstream.StreamConfig, log *zap.Logger) error {
	asked := want.MaxBytes
	for {
		_, err := js.CreateStream(ctx, *want)
		var api *jetstream.APIError
		if err == nil || !errors.As(err, &api) || api.ErrorCode != errStorageResourcesExceeded || want.MaxBytes/2 < minRepliesBytes {
			if err == nil && want.MaxBytes != asked {
				log.Warn("the kept answers of Idempotency-Key requests are bounded lower than --control-replies-max-mib asks, to fit the storage JetStream has left to reserve; the bucket keeps this bound: once the server has room, raise it as the NATS admin user",
					zap.String("stream", want.Name), zap.Int64("maxBytes", want.MaxBytes), zap.Int64("asked", asked),
					zap.String("fix", fmt.Sprintf("nats stream edit %s --max-bytes %d", want.Name, asked)))
			}
			return err
		}
		want.MaxBytes /= 2
	}
}

// repliesStream is the bucket's stream as the KV API makes it (History 1,
// direct get, roll-ups, no deletes of the stream's messages), with a
// bound and discard old, which the KV API cannot set.
func repliesStream(opts KVRepliesOptions) jetstream.StreamConfig {
	ttl := opts.TTL
	if ttl <= 0 {
		ttl = 24 * time.Hour
	}
	return jetstream.StreamConfig{
		Name:              "KV_" + KVRepliesBucket,
		Description:       "first answers of control requests with an Idempotency-Key",
		Subjects:          []string{"$KV." + KVRepliesBucket + ".>"},
		MaxMsgsPerSubject: 1,
		MaxBytes:          opts.MaxBytes,
		MaxAge:            ttl,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           jetstream.FileStorage,
		Replicas:          max(opts.Replicas, 1),
		AllowRollup:       true,
		DenyDelete:        true,
		AllowDirect:       true,
		Duplicates:        min(2*time.Minute, ttl), // the KV API's duplicate window
		Discard:           jetstream.DiscardOld,
	}
}

// reportBound warns, once at open, when the existing bucket has another
// bound or discard policy than want (it was created before the bound, or
// with another --control-replies-max-bytes): serve never updates a stream
// (its NATS user may not), so the bucket is used as it is, and the
// warning carries the command that aligns it.
func reportBound(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, log *zap.Logger) error {
	st, err := natsstore.BindStream(ctx, js, want.Name)
	if err != nil {
		return err
	}
	have := st.CachedInfo().Config
	if have.MaxBytes != want.MaxBytes || have.Discard != want.Discard {
		log.Warn("the kept answers of Idempotency-Key requests keep the bound their bucket was created with, not --control-replies-max-mib's (maxBytes -1: none, they grow until their TTL); change it as the NATS admin user",
			zap.String("stream", want.Name), zap.Int64("maxBytes", have.MaxBytes), zap.Stringer("discard", have.Discard), zap.Int64("want", want.MaxBytes),
			zap.String("fix", fmt.Sprintf("nats stream edit %s --max-bytes %d --discard old", want.Name, want.MaxBytes)))
	}
	return nil
}

// replyPartBytes is the most one entry of the bucket holds, for a
// connection whose server takes messages of up to maxPayload bytes: the
// rest of the message (subject, headers) gets 8 KiB.
func replyPartBytes(maxPayload int64) int {
	return int(max(maxPayload-8<<10, 32<<10))
}

type replyEntry struct {
	Fingerprint string    `json:"fingerprint"`
	ClaimedAt   time.Time `json:"claimedAt"`
	Reply       *Reply    `json:"reply,omitempty"`
	// Parts, when not 0: the answer's body is not in Reply but kept
	// gzipped in Parts entries of their own (partKey), written before this
	// one; PartsSHA256 is the hash of their bytes in order.
	Parts       int    `json:"parts,omitempty"`
	PartsSHA256 string `json:"partsSha256,omitempty"`
}

// errPartsGone: a kept answer's parts are missing or are not the ones its
// entry names (they expired first, being written first, or a keep was cut
// short); the answer is taken as expired.
var errPartsGone = errors.New("httpapi: the parts of a kept answer are gone")

// partKey names the i-th part of the answer kept under key.
func partKey(key string, i int) string { return fmt.Sprintf("%s.p%d", key, i) }

// Claim implements Replies.
func (k *KVReplies) Claim(ctx context.Context, key, fp string) (*Reply, error) {
	claim, _ := json.Marshal(replyEntry{Fingerprint: fp, ClaimedAt: k.now().UTC()})
	for range 3 {
		if _, err := k.kv.Create(ctx, key, claim); err == nil {
			return nil, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, err
		}
		e, err := k.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return nil, err
		}
		var held replyEntry
		if err := json.Unmarshal(e.Value(), &held); err != nil {
			return nil, fmt.Errorf("kept reply %s: %w", key, err)
		}
		switch {
		case held.Fingerprint != fp:
			return nil, ErrKeyReused
		case held.Reply != nil && held.Parts == 0:
			return held.Reply, nil
		case held.Reply != nil:
			body, err := k.readParts(ctx, key, &held)
			if err == nil {
				return &Reply{Status: held.Reply.Status, Body: body}, nil
			}
			if !errors.Is(err, errPartsGone) {
				return nil, err
			}
			// As if the whole answer had expired: take the key over.
		case k.now().Sub(held.ClaimedAt) < k.StaleAfter:
			return nil, ErrReplyPending
		}
		// A stale claim (or an answer whose parts are gone): take it over,
		// unless someone else just did.
		if _, err := k.kv.Update(ctx, key, claim, e.Revision()); err == nil {
			return nil, nil
		}
	}
	return nil, ErrReplyPending
}

// Keep implements Replies. An answer whose entry would not fit into one
// message of the bucket (a bulk action's over thousands of runs) is kept
// gzipped in parts, each an entry of its own, written before the entry
// that names them.
func (k *KVReplies) Keep(ctx context.Context, key, fp string, r *Reply) error {
	e := replyEntry{Fingerprint: fp, ClaimedAt: k.now().UTC(), Reply: r}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if len(b) > k.partBytes {
		if e, err = k.keepParts(ctx, key, e); err != nil {
			return err
		}
		if b, err = json.Marshal(e); err != nil {
			return err
		}
	}
	_, err = k.kv.Put(ctx, key, b)
	return err
}

// keepParts writes e's answer body gzipped in parts and returns the entry
// that names them.
func (k *KVReplies) keepParts(ctx context.Context, key string, e replyEntry) (replyEntry, error) {
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	if _, err := zw.Write(e.Reply.Body); err != nil {
		return e, err
	}
	if err := zw.Close(); err != nil {
		return e, err
	}
	data := z.Bytes()
	n := 0
	for from := 0; from < len(data); from += k.partBytes {
		if _, err := k.kv.Put(ctx, partKey(key, n), data[from:min(len(data), from+k.partBytes)]); err != nil {
			return e, fmt.Errorf("keeping part %d of the answer: %w", n, err)
		}
		n++
	}
	sum := sha256.Sum256(data)
	e.Reply = &Reply{Status: e.Reply.Status}
	e.Parts, e.PartsSHA256 = n, hex.EncodeToString(sum[:])
	return e, nil
}

// readParts reads the answer body that held's parts keep.
func (k *KVReplies) readParts(ctx context.Context, key string, held *replyEntry) ([]byte, error) {
	var data []byte
	for i := range held.Parts {
		e, err := k.kv.Get(ctx, partKey(key, i))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, errPartsGone
		}
		if err != nil {
			return nil, err
		}
		data = append(data, e.Value()...)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != held.PartsSHA256 {
		return nil, errPartsGone
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("kept reply %s: %w", key, err)
	}
	body, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("kept reply %s: %w", key, err)
	}
	return body, nil
}

// Release implements Replies.
func (k *KVReplies) Release(ctx context.Context, key string) error {
	return k.kv.Delete(ctx, key)
}

// controlRoute wraps a control action: it counts the request in
// sidecar_control_requests_total{action,result} and, when the request
// carries an Idempotency-Key and the server has Replies, answers a repeated
// key with the first answer. Answers of 5xx are not kept: the request did
// not take effect completely, and a retry with the same key runs it again.
func (s *Server) controlRoute(action string, h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		idem := r.Header.Get(IdempotencyKeyHeader)
		if idem == "" || s.opts.Replies == nil {
			rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
			err := h(rec, r)
			status := rec.status
			if err != nil {
				status = s.answer(err).status
			}
			s.countControl(action, resultOf(status))
			return err
		}
		if len(idem) > MaxIdempotencyKeyBytes {
			s.countControl(action, "bad_request")
			return badRequest(IdempotencyKeyHeader, fmt.Sprintf("%s is longer than %d bytes", IdempotencyKeyHeader, MaxIdempotencyKeyBytes))
		}
		body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxBodyBytes))
		if err != nil {
			s.countControl(action, "bad_request")
			if ae, ok := tooLarge(err); ok {
				return ae
			}
			return badRequest("", "reading the body: "+err.Error())
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		key, fp := replyKey(r, idem, body)
		if s.unreleased.due(key) {
			// This replica's own claim, of a request answered 5xx while
			// the store was down: nothing runs it, so let it go now.
			if err := s.opts.Replies.Release(r.Context(), key); err == nil {
				s.unreleased.remove(key)
			}
		}
		kept, err := s.opts.Replies.Claim(r.Context(), key, fp)
		switch {
		case errors.Is(err, ErrKeyReused):
			s.countControl(action, "bad_request")
			return &apiError{status: http.StatusUnprocessableEntity, Code: CodeKeyReused,
				Message: "this Idempotency-Key was first used for another request (another body); use a new key"}
		case errors.Is(err, ErrReplyPending):
			s.countControl(action, "in_progress")
			return &apiError{status: http.StatusConflict, Code: CodeInProgress,
				Message: "a request with this Idempotency-Key is being answered; retry shortly"}
		case err != nil:
			s.countControl(action, "error")
			return &apiError{status: http.StatusServiceUnavailable, Code: "STORE_UNAVAILABLE", Message: "idempotency store: " + err.Error()}
		case kept != nil:
			s.countControl(action, "replayed")
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(ReplayedHeader, "true")
			w.WriteHeader(kept.Status)
			_, _ = w.Write(kept.Body)
			return nil
		}
		buf := &bufferedWriter{header: http.Header{}, status: http.StatusOK}
		if err := h(buf, r); err != nil {
			buf.header = http.Header{}
			buf.body.Reset()
			s.writeErr(buf, action, err)
		}
		s.countControl(action, resultOf(buf.status))
		// Keeping or releasing must outlive a client that went away.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		defer cancel()
		if buf.status >= 500 {
			if err := s.opts.Replies.Release(ctx, key); err != nil {
				s.unreleased.add(key)
				s.log.Warn("could not release an idempotency key; a retry on this replica releases it, on another waits until the claim is stale", zap.Error(err))
			}
		} else if err := s.opts.Replies.Keep(ctx, key, fp, &Reply{Status: buf.status, Body: bytes.TrimSpace(buf.body.Bytes())}); err != nil {
			s.log.Warn("could not keep the answer of an idempotent request; a retry runs it again", zap.Error(err))
		}
		for k, v := range buf.header {
			w.Header()[k] = v
		}
		w.WriteHeader(buf.status)
		_, _ = w.Write(buf.body.Bytes())
		return nil
	}
}

// replyKey names a kept reply: the key is scoped to the principal (its
// name and scope; none without authentication), the run, the action
// (path) and the client's key, so that each principal has keys of its
// own: another principal's request with the same key is a request of its
// own, and learns nothing of the first, not even that the key was used.
// The fingerprint adds the body, so that a principal's key reused with
// another body is refused rather than replayed.
func replyKey(r *http.Request, idem string, body []byte) (key, fp string) {
	var who []byte
	if p := PrincipalFrom(r.Context()); p != nil {
		who, _ = json.Marshal([]string{p.Name, p.Scope.TenantID, p.Scope.ProjectID, p.Scope.EnvironmentID})
	}
	kh := sha256.New()
	kh.Write([]byte(r.Method + " " + r.URL.Path + "\x00" + idem))
	if who != nil {
		// Without a principal the key is what it always was.
		kh.Write([]byte("\x00"))
		kh.Write(who)
	}
	k := kh.Sum(nil)
	h := sha256.New()
	for _, part := range [][]byte{[]byte(r.Method + " " + r.URL.Path), []byte(idem), who, body} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return "r" + hex.EncodeToString(k), hex.EncodeToString(h.Sum(nil))
}

// resultOf is the result label of a control answer's status: ok,
// invalid_transition (409), not_found, bad_request (other 4xx),
// engine_unavailable (503), error (other 5xx).
func resultOf(status int) string {
	switch {
	case status < 300:
		return "ok"
	case status == http.StatusConflict:
		return "invalid_transition"
	case status == http.StatusNotFound:
		return "not_found"
	case status < 500:
		return "bad_request"
	case status == http.StatusServiceUnavailable:
		return "engine_unavailable"
	}
	return "error"
}

// countControl counts a control request by action and result (resultOf's,
// plus replayed and in_progress of the Idempotency-Key layer).
func (s *Server) countControl(action, result string) {
	s.controls.WithLabelValues(action, result).Inc()
}

// controlResults are the result label values, pre-created per action so
// that a dashboard shows zeros rather than no data.
var controlResults = []string{"ok", "replayed", "in_progress", "invalid_transition", "not_found", "bad_request", "engine_unavailable", "error"}

// bufferedWriter holds an answer until it is kept.
type bufferedWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header         { return b.header }
func (b *bufferedWriter) Write(p []byte) (int, error) { return b.body.Write(p) }
func (b *bufferedWriter) WriteHeader(code int)        { b.status = code }

// Streams are the JetStream streams the replies are kept in: the
// bucket's.
func (r *KVReplies) Streams() []string { return []string{"KV_" + r.kv.Bucket()} }

// repliesSizeTimeout bounds the stream-info request of one scrape.
const repliesSizeTimeout = 2 * time.Second

var (
	repliesBytesDesc = prometheus.NewDesc("sidecar_control_replies_bytes",
		"Bytes the kept answers of Idempotency-Key requests hold now (JetStream: the bucket's stream).", nil, nil)
	repliesMaxBytesDesc = prometheus.NewDesc("sidecar_control_replies_max_bytes",
		"The bound of the kept answers' bucket (-1: none, a bucket this NATS user may not update). At the bound the oldest answers are evicted before their TTL.", nil, nil)
)

// SizeCollector exports the bucket's size at each scrape:
// sidecar_control_replies_bytes and sidecar_control_replies_max_bytes. A
// scrape the server does not answer within 2 s exports neither. Register
// it with the node's registry.
func (k *KVReplies) SizeCollector() prometheus.Collector { return repliesSize{k} }

type repliesSize struct{ k *KVReplies }

func (c repliesSize) Describe(ch chan<- *prometheus.Desc) {
	ch <- repliesBytesDesc
	ch <- repliesMaxBytesDesc
}

func (c repliesSize) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), repliesSizeTimeout)
	defer cancel()
	st, err := c.k.js.Stream(ctx, "KV_"+c.k.kv.Bucket())
	if err != nil {
		return
	}
	info := st.CachedInfo()
	ch <- prometheus.MustNewConstMetric(repliesBytesDesc, prometheus.GaugeValue, float64(info.State.Bytes))
	ch <- prometheus.MustNewConstMetric(repliesMaxBytesDesc, prometheus.GaugeValue, float64(info.Config.MaxBytes))
}

// maxUnreleased bounds the keys a Server remembers it could not release:
// beyond it the oldest is forgotten (its claim goes stale on its own).
const maxUnreleased = 4096

// releaseWithin is how long after its 5xx answer a claim this replica
// could not release is released by a retry: well inside the minute after
// which a claim is stale and another replica may take it over (whose
// claim a later release would delete).
const releaseWithin = 30 * time.Second

// unreleasedKeys are the keys of claims a 5xx answer could not release,
// with when, oldest first.
type unreleasedKeys struct {
	mu    sync.Mutex
	at    map[string]time.Time
	order []string
}

func (u *unreleasedKeys) add(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.at == nil {
		u.at = map[string]time.Time{}
	}
	if _, ok := u.at[key]; !ok {
		u.order = append(u.order, key)
	}
	u.at[key] = time.Now()
	for len(u.order) > maxUnreleased {
		delete(u.at, u.order[0])
		u.order = u.order[1:]
	}
}

// due reports whether key's claim is this replica's own, unreleased and
// recent enough to release (releaseWithin); an older one is forgotten.
func (u *unreleasedKeys) due(key string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	at, ok := u.at[key]
	if ok && time.Since(at) >= releaseWithin {
		u.forget(key)
		return false
	}
	return ok
}

func (u *unreleasedKeys) remove(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.forget(key)
}

func (u *unreleasedKeys) forget(key string) {
	if _, ok := u.at[key]; !ok {
		return
	}
	delete(u.at, key)
	u.order = slices.DeleteFunc(u.order, func(k string) bool { return k == key })
}
